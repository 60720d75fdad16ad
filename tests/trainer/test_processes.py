"""What several training processes must do together: agree on stopping, and leave the shared log files to the main
process. Seen from one process, with accelerate's collectives replaced by what its partner would contribute."""

from __future__ import annotations

import json
import signal

import pytest
import torch

from services.trainer.processes import StopFlag, truncate_logs


class Partner:
    """accelerate's reduce and barrier as one of two processes sees them."""

    num_processes, device = 2, torch.device("cpu")

    def __init__(self, main: bool, partner_stops: bool = False) -> None:
        self.is_main_process, self.partner_stops, self.barriers = main, partner_stops, 0

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        assert reduction == "max"
        return torch.maximum(tensor, torch.tensor([float(self.partner_stops)]))

    def wait_for_everyone(self) -> None:
        self.barriers += 1


@pytest.fixture
def stop():
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    yield StopFlag()
    signal.signal(signal.SIGINT, handlers[0])
    signal.signal(signal.SIGTERM, handlers[1])


def test_a_stop_asked_of_one_process_stops_both(stop):
    assert not stop.agreed(Partner(main=True))
    assert stop.agreed(Partner(main=True, partner_stops=True))  # the signal reached the other process first
    assert stop()  # and this process now takes the same branch at every later check


def test_a_stop_asked_here_is_agreed_by_one_process_alone(stop):
    stop.requested = True

    class Alone:
        num_processes = 1

    assert stop.agreed(Alone())


def _log(path, updates):
    path.write_text("".join(json.dumps({"update": u}) + "\n" for u in updates))


@pytest.mark.parametrize("main", [True, False])
def test_resume_truncates_the_logs_on_the_main_process_only_then_waits(tmp_path, main):
    for name in ("metrics.jsonl", "episodes.jsonl"):
        _log(tmp_path / name, [1, 2, 3])
    process = Partner(main=main)
    truncate_logs(tmp_path, 2, process)
    for name in ("metrics.jsonl", "episodes.jsonl"):
        kept = [json.loads(line)["update"] for line in (tmp_path / name).read_text().splitlines()]
        assert kept == ([1, 2] if main else [1, 2, 3])
    assert process.barriers == 1  # nobody reads or appends before the main process has rewritten them
