"""Admission to a GPU's memory (device_memory.DeviceMemory), with plain asyncio: who waits, in which order, and the
message of a reservation that can never fit."""

from __future__ import annotations

import asyncio

import pytest

from services.evaluator.device_memory import GIB, DeviceMemory, DoesNotFitError


async def _hold(memory: DeviceMemory, nbytes: int | None, name: str, log: list[str], release: asyncio.Event) -> float:
    async with memory.reserve(nbytes, name) as waited:
        log.append(f"{name} in")
        await release.wait()
        log.append(f"{name} out")
    return waited


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def test_reservations_that_fit_together_run_together_and_the_next_waits_for_room() -> None:
    async def run() -> list[str]:
        memory, log = DeviceMemory(10 * GIB), list[str]()
        first, second, third = asyncio.Event(), asyncio.Event(), asyncio.Event()
        tasks = [
            asyncio.create_task(_hold(memory, 4 * GIB, "a", log, first)),
            asyncio.create_task(_hold(memory, 4 * GIB, "b", log, second)),
            asyncio.create_task(_hold(memory, 4 * GIB, "c", log, third)),
        ]
        await _settle()
        assert (memory.reserved, memory.waiting) == (8 * GIB, 1)
        first.set()
        await _settle()
        assert memory.reserved == 8 * GIB
        second.set()
        third.set()
        waited = await asyncio.gather(*tasks)
        assert waited[0] < 0.1 and waited[1] < 0.1
        assert memory.reserved == 0 and memory.waiting == 0
        return log

    assert asyncio.run(run()) == ["a in", "b in", "a out", "c in", "b out", "c out"]


def test_first_come_first_served_a_small_reservation_does_not_pass_a_waiting_large_one() -> None:
    async def run() -> list[str]:
        memory, log = DeviceMemory(10 * GIB), list[str]()
        release = {name: asyncio.Event() for name in "abc"}
        tasks = [asyncio.create_task(_hold(memory, 6 * GIB, "a", log, release["a"]))]
        await _settle()
        tasks.append(asyncio.create_task(_hold(memory, 8 * GIB, "b", log, release["b"])))
        await _settle()
        # 3 GiB would fit beside a (not beside b), but b came first.
        tasks.append(asyncio.create_task(_hold(memory, 3 * GIB, "c", log, release["c"])))
        await _settle()
        assert memory.waiting == 2
        for name in "abc":
            release[name].set()
            await _settle()
        await asyncio.gather(*tasks)
        return log

    assert asyncio.run(run()) == ["a in", "a out", "b in", "b out", "c in", "c out"]


def test_the_whole_device_waits_for_every_reservation_and_holds_off_the_rest() -> None:
    async def run() -> list[str]:
        memory, log = DeviceMemory(10 * GIB), list[str]()
        release = {name: asyncio.Event() for name in "abc"}
        tasks = [asyncio.create_task(_hold(memory, GIB, "a", log, release["a"]))]
        await _settle()
        tasks.append(asyncio.create_task(_hold(memory, None, "b", log, release["b"])))
        await _settle()
        tasks.append(asyncio.create_task(_hold(memory, GIB, "c", log, release["c"])))
        await _settle()
        assert log == ["a in"]
        release["a"].set()
        await _settle()
        assert memory.exclusive and log[-1] == "b in"
        release["c"].set()
        await _settle()
        assert log[-1] == "b in"
        release["b"].set()
        await asyncio.gather(*tasks)
        return log

    assert asyncio.run(run()) == ["a in", "a out", "b in", "b out", "c in", "c out"]


def test_until_the_capacity_is_known_one_at_a_time() -> None:
    async def run() -> None:
        memory, log = DeviceMemory(), list[str]()
        release = {name: asyncio.Event() for name in "ab"}
        tasks = [asyncio.create_task(_hold(memory, GIB, name, log, release[name])) for name in "ab"]
        await _settle()
        assert log == ["a in"]
        await memory.learn_capacity(10 * GIB)
        await _settle()
        assert log == ["a in", "b in"]
        # A capacity once known (or set by the settings) stays.
        await memory.learn_capacity(GIB)
        assert memory.capacity == 10 * GIB
        for event in release.values():
            event.set()
        await asyncio.gather(*tasks)

    asyncio.run(run())


def test_a_cancelled_wait_gives_its_place_to_the_next() -> None:
    async def run() -> None:
        memory, log = DeviceMemory(10 * GIB), list[str]()
        release = {name: asyncio.Event() for name in "abc"}
        holder = asyncio.create_task(_hold(memory, 6 * GIB, "a", log, release["a"]))
        await _settle()
        large = asyncio.create_task(_hold(memory, 8 * GIB, "b", log, release["b"]))
        await _settle()
        small = asyncio.create_task(_hold(memory, 2 * GIB, "c", log, release["c"]))
        await _settle()
        large.cancel()
        await _settle()
        assert log == ["a in", "c in"] and memory.waiting == 0
        release["a"].set()
        release["c"].set()
        await asyncio.gather(holder, small)
        assert memory.reserved == 0

    asyncio.run(run())


def test_a_reservation_larger_than_the_gpu_names_the_sizes() -> None:
    async def run() -> None:
        memory = DeviceMemory(10 * GIB)
        with pytest.raises(DoesNotFitError, match=r"this problem needs 12\.0 GiB .* may reserve 10\.0 GiB"):
            async with memory.reserve(12 * GIB, "this problem"):
                pass
        assert memory.waiting == 0 and memory.reserved == 0

    asyncio.run(run())
