"""torch_archive: every file torch.save writes passes; every archive that torch.load (miniz) could read differently
from the check, and every pickle nested past the limit, is refused. Archives are built by hand here, so each
field the check reads can be set wrong on purpose."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

import pytest
import torch

from services.evaluator import compare, torch_archive
from services.evaluator.torch_archive import UnsafeArchiveError

LIMITS = {"max_records": 64, "max_pickle_bytes": 1 << 20, "max_nesting": 32, "max_objects": 1 << 16}
_U32 = 0xFFFFFFFF


def saved(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def saved_records(value: object) -> list[tuple[bytes, bytes]]:
    with zipfile.ZipFile(io.BytesIO(saved(value))) as archive:
        return [(info.filename.encode(), archive.read(info)) for info in archive.infolist()]


def build(
    records: list[tuple[bytes, bytes]],
    *,
    zip64: bool = False,
    suffix: bytes = b"",
    flags: int = 0,
    method: int = 0,
    offsets: dict[int, int] | None = None,
) -> bytes:
    """A zip archive of stored `records`; `offsets` overrides entry i's local header offset in the directory."""
    body = bytearray()
    directory = bytearray()
    for index, (name, data) in enumerate(records):
        offset = len(body)
        crc = zlib.crc32(data)
        body += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, flags, method, 0, 0, crc, len(data), len(data),
                            len(name), 0) + name + data  # fmt: skip
        offset = (offsets or {}).get(index, offset)
        extra = struct.pack("<HHQ", 1, 8, offset) if zip64 else b""
        directory += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 45, 45, flags, method, 0, 0, crc, len(data),
                                 len(data), len(name), len(extra), 0, 0, 0, 0, _U32 if zip64 else offset)  # fmt: skip
        directory += name + extra
    start = len(body)
    body += directory
    if zip64:
        zip64_offset = len(body)
        body += struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, len(records), len(records),
                            len(directory), start)  # fmt: skip
        body += struct.pack("<4sIQI", b"PK\x06\x07", 0, zip64_offset, 1)
        body += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, _U32, _U32, 0)
    else:
        body += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(records), len(records), len(directory), start, 0)
    return bytes(body + suffix)


def check(data: bytes, **limits: int) -> None:
    torch_archive.check(io.BytesIO(data), len(data), **{**LIMITS, **limits})


def refused(data: bytes, match: str, **limits: int) -> None:
    with pytest.raises(UnsafeArchiveError, match=match):
        check(data, **limits)


def with_pickle(pickle_bytes: bytes) -> bytes:
    records = saved_records([])
    return build([(name, pickle_bytes if name.endswith(b"/data.pkl") else data) for name, data in records])


VALUES = {
    "runner_output": {"outputs": [torch.randn(3, 4), torch.zeros(2, dtype=torch.int64)], "inputs_after": []},
    "numbers_and_none": {"outputs": [1, 2.5, True, None, 2**40], "inputs_after": [torch.ones(1)]},
    "views_and_dtypes": [torch.randn(4, 4).t(), torch.ones(3, dtype=torch.bfloat16), torch.randn(2, 3)[:, 1]],
    "complex_and_bool": [torch.randn(2, dtype=torch.complex64), torch.tensor([True, False])],
    "dtypes_without_storage_class": [torch.ones(2, dtype=torch.uint16), torch.ones(2, dtype=torch.float8_e4m3fn)],
    "shared_storage": [torch.arange(6.0)[:3], torch.arange(6.0)[3:]],
    "deepest_lists": {"outputs": [[[[[[[[[[[[[[[[torch.ones(1)]]]]]]]]]]]]]]]], "inputs_after": []},
    "tuples": {"outputs": (torch.ones(2), (torch.zeros(1), 3)), "inputs_after": []},
}


@pytest.mark.parametrize("name", list(VALUES))
def test_what_torch_save_writes_passes(name: str) -> None:
    check(saved(VALUES[name]))


def test_the_runner_limits_admit_the_most_outputs_a_trial_may_have() -> None:
    value = {"outputs": [torch.ones(1)] * 2 + [torch.ones(1) for _ in range(compare.MAX_LEAVES - 2)],
             "inputs_after": [torch.zeros(1) for _ in range(compare.MAX_LEAVES)]}  # fmt: skip
    data = saved(value)
    torch_archive.check(
        io.BytesIO(data),
        len(data),
        max_records=compare.MAX_RECORDS,
        max_pickle_bytes=compare.MAX_PICKLE_BYTES,
        max_nesting=compare.MAX_PICKLE_NESTING,
        max_objects=compare.MAX_PICKLE_OBJECTS,
    )


def test_hand_built_archives_load_as_torch_reads_them() -> None:
    """The builder makes archives torch.load reads, so the refusals below are of files torch would read."""
    value = {"outputs": [torch.arange(6.0).reshape(2, 3)], "inputs_after": []}
    for zip64 in (False, True):
        data = build(saved_records(value), zip64=zip64)
        check(data)
        loaded = torch.load(io.BytesIO(data), weights_only=True)
        assert torch.equal(loaded["outputs"][0], value["outputs"][0])


def test_a_directory_that_does_not_end_at_the_end_record_is_refused() -> None:
    """Bytes before the archive: Python's zipfile shifts every offset to match, miniz takes them as written; which
    records are read then depends on the reader (how a deflated record hid from the old check)."""
    data = b"PK\x03\x04" + bytes(60) + build(saved_records([torch.ones(2)]))
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.testzip() is None  # the other reader is content
    refused(data, "central directory does not end")


def test_trailing_bytes_and_comments_are_refused() -> None:
    records = saved_records([torch.ones(2)])
    refused(build(records, suffix=b"x"), "does not end with its end-of-central-directory")
    data = bytearray(build(records))
    data[-2:] = struct.pack("<H", 3)
    refused(bytes(data) + b"abc", "does not end with its end-of-central-directory")


def test_records_that_are_not_stored_plainly_are_refused() -> None:
    records = saved_records([torch.ones(2)])
    refused(build(records, method=8), "compressed, encrypted")
    refused(build(records, flags=1), "compressed, encrypted")


def test_names_that_differ_only_in_case_are_refused() -> None:
    records = saved_records([torch.ones(2)])
    pickle_name, pickle_data = next(record for record in records if record[0].endswith(b"/data.pkl"))
    refused(build([*records, (pickle_name.upper(), pickle_data)]), "repeated record name")
    refused(build([*records, (b"archive/x\x00y", b"")]), "unexpected or repeated")


def test_overlapping_and_misplaced_records_are_refused() -> None:
    records = saved_records([torch.ones(2)])
    refused(build(records, offsets={1: 0}), "overlap|does not match")
    refused(build(records, offsets={1: 7}), "overlap|does not match")


def test_the_zip64_end_record_must_sit_where_its_locator_says() -> None:
    data = bytearray(build(saved_records([torch.ones(2)]), zip64=True))
    locator = len(data) - 22 - 20
    struct.pack_into("<Q", data, locator + 8, struct.unpack_from("<Q", data, locator + 8)[0] - 1)
    refused(bytes(data), "zip64 locator")


def test_too_many_records_and_too_long_a_pickle_are_refused() -> None:
    data = saved([torch.ones(1) for _ in range(10)])
    refused(data, "at most 8 are allowed", max_records=8)
    refused(data, "pickle has", max_pickle_bytes=64)


def nested_tuple_key(depth: int) -> bytes:
    """{((...(),...),): None}, the key `depth` tuples deep: hashing it recurses in C once per level."""
    return b"\x80\x02}" + b")" + b"\x85" * depth + b"Ns."


def test_a_deeply_nested_dict_key_is_refused_before_anything_hashes_it() -> None:
    refused(with_pickle(nested_tuple_key(300_000)), "nested deeper than 32")
    refused(with_pickle(nested_tuple_key(20)), "not a string")


def shared_tuple_key(levels: int) -> bytes:
    """{t: None} with t = (t', t'), t' = (t'', t''), ... `levels` deep through the memo: a few bytes a level, and
    2^levels tuples for the key's hash to walk (minutes of C holding the GIL from 30 levels)."""
    body = b")" + b"".join(b"q" + bytes([level]) + b"h" + bytes([level]) + b"\x86" for level in range(levels))
    return b"\x80\x02}" + body + b"Ns."


def test_objects_reached_through_shared_references_are_counted() -> None:
    refused(with_pickle(shared_tuple_key(30)), "reaches more than 65536 objects")
    # A tuple of 300 Nones, then a list that holds it 300 times: 90,301 objects reached.
    inner = b"(" + b"N" * 300 + b"tq\x01"
    refused(with_pickle(b"\x80\x02]q\x00(" + inner + b"h\x01" * 299 + b"e."), "reaches more than 65536")
    check(with_pickle(b"\x80\x02]q\x00(" + inner + b"h\x01" * 99 + b"e."))


def test_deep_lists_and_self_appending_lists_are_refused() -> None:
    deep = b"\x80\x02" + b"]" * 100 + b"a" * 99 + b"."
    refused(with_pickle(deep), "nested deeper")
    # Appended to itself: a cycle (each list or dict is written once; none is fetched again).
    self_appending = b"\x80\x02]q\x00" + b"h\x00a" * 40 + b"."
    refused(with_pickle(self_appending), "referred to twice")


def global_call(module_name: bytes, argument: bytes) -> bytes:
    """module.name(argument) in pickle opcodes."""
    return b"\x80\x02c" + module_name + b"\n" + argument + b"\x85R."


def _text(value: str) -> bytes:
    return b"X" + len(value).to_bytes(4, "little") + value.encode()


def storage_id(key: bytes) -> bytes:
    """("storage", torch.ByteStorage, key, "cpu", 4) as a persistent id: `key` is the pickled key."""
    return b"(" + _text("storage") + b"ctorch\nByteStorage\n" + key + _text("cpu") + b"K\x04tQ"


def with_storage(pickle_bytes: bytes) -> bytes:
    return build([(b"archive/data.pkl", pickle_bytes), (b"archive/data/ab", b"1234"), (b"archive/version", b"3\n")])


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_storage_ids_must_name_a_record_as_spelled() -> None:
    """Each spelling of a key that miniz finds without regard to case was loaded as a storage of its own: a
    record of 1 MiB under 250,000 spellings would have needed 244 GiB."""
    check(with_storage(b"\x80\x02" + storage_id(_text("ab")) + b"."))
    assert torch.load(io.BytesIO(with_storage(b"\x80\x02" + storage_id(_text("ab")) + b".")), weights_only=True)
    refused(with_storage(b"\x80\x02" + storage_id(_text("AB")) + b"."), "naming no record")
    # A key that is a tuple was formatted into a record name (256 MiB of it from a 1 MB file).
    refused(with_storage(b"\x80\x02" + storage_id(_text("ab") + b"\x85") + b"."), 'not \\("storage"')


def tensor(hooks: bytes) -> bytes:
    """A 4-byte tensor of the storage "ab" (with_storage), put in memo 2, whose backward hooks are `hooks`."""
    arguments = storage_id(_text("ab")) + b"K\x00K\x04\x85K\x01\x85\x89" + hooks
    return b"ctorch._utils\n_rebuild_tensor_v2\n(" + arguments + b"tRq\x02"


# Empty backward hooks, put in memo 1, as torch.save writes them.
EMPTY_HOOKS = b"ccollections\nOrderedDict\n)Rq\x01"


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_a_tensor_cannot_hold_anything_in_its_backward_hooks() -> None:
    """A red-team output held itself in its tensor's hooks: the cycle kept the mapped file alive in the reference's
    timer after each check (which the memory watch then counted against the timer: `evaluator_error` for a wrong
    candidate) and its tensors in the service after the evaluation."""
    plain = with_storage(b"\x80\x02]q\x00(" + tensor(EMPTY_HOOKS) + b"e.")
    check(plain)
    assert torch.load(io.BytesIO(plain), weights_only=True)[0].numel() == 4
    cycle = b"\x80\x02]q\x00(" + tensor(EMPTY_HOOKS) + b"h\x01" + _text("x") + b"h\x02se."
    refused(with_storage(cycle), "referred to twice")
    filled = b"\x80\x02]q\x00(" + tensor(EMPTY_HOOKS[:-2] + _text("k") + b"]s") + b"e."
    refused(with_storage(filled), "SETITEM on ordered dict")


@pytest.mark.parametrize(
    ("pickle_bytes", "match"),
    [
        (b"\x80\x02" + _text("x" * 100) + b")R.", r"does not write \(text\)"),
        (global_call(b"torch.storage\nUntypedStorage", b"J\x00\x00\x00\x01"), r"does not write \(storage class\)"),
        (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(K\x00tR.", "does not write"),
    ],
    ids=["string_called", "storage_called", "rebuild_without_storage"],
)
def test_only_the_calls_torch_save_writes_are_allowed(pickle_bytes: bytes, match: str) -> None:
    """A string as the function of a call went into torch's error message, through a regex quadratic in its
    length (40 KB: 12 s holding the GIL); a storage called with a size was a repr looping over every byte."""
    refused(with_pickle(pickle_bytes), match)


@pytest.mark.parametrize(
    ("pickle_bytes", "match"),
    [
        (global_call(b"builtins\nbytearray", b"J\x00\x00\x00@"), "global 'builtins bytearray'"),
        (global_call(b"_codecs\nencode", b"X\x01\x00\x00\x00a"), "global '_codecs encode'"),
        (global_call(b"collections\nOrderedDict", b"]"), "a call torch.save does not write"),
        (b"\x80\x02}X\x01\x00\x00\x00a}b.", "BUILD"),
    ],
    ids=["bytearray", "codecs", "ordered_dict_of_items", "build"],
)
def test_calls_torch_save_never_writes_are_refused(pickle_bytes: bytes, match: str) -> None:
    """The weights-only unpickler allows these; from a few bytes they made gigabytes (bytearray, hex encoding) or
    minutes (bz2) of work in the service."""
    refused(with_pickle(pickle_bytes), match)


@pytest.mark.parametrize(
    ("pickle_bytes", "match"),
    [
        (b"\x80\x04\x95" + bytes(8) + b"N.", "protocol 4"),
        (b"\x80\x02\x8c\x01aN.", "SHORT_BINUNICODE"),
        (b"\x80\x02h\x05.", "malformed pickle"),
        (b"\x80\x02(N.", "one object"),
        (b"\x80\x02X\xff\x00\x00\x00ab", "malformed pickle"),
        (b"\x80\x02NN.", "one object"),
    ],
)
def test_pickles_torch_save_never_writes_are_refused(pickle_bytes: bytes, match: str) -> None:
    refused(with_pickle(pickle_bytes), match)


def test_compare_reports_a_refused_archive_as_malformed() -> None:
    with pytest.raises(compare.MalformedDataError, match="nested deeper"):
        compare.load_data(with_pickle(nested_tuple_key(100)))
