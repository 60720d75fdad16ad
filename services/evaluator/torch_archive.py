"""What a candidate's saved file must be before torch.load may read it: the zip archive torch.save writes, read
strictly, and a pickle of the shape torch.save writes for our runner's data.

torch.load reads archives with miniz, and nothing else we could call sees them as miniz does: Python's zipfile, for
one, finds the central directory at the end-of-central-directory record's position minus its size, where miniz
takes the offset the record states. A file that gives the two different directories passes a zipfile check and
loads records it never saw (deflated ones: 262 KB that inflated to 256 MiB). So this module reads the archive
itself and refuses every place where readers may disagree: the end record not last or with a comment, a directory
not ending where the end record starts, offsets outside, overlapping or out of order, local headers that do not
match the directory, names that differ only in case (miniz looks names up case-insensitively), encryption flags,
anything but stored records.

torch's weights-only unpickler is safe by type, not by cost: a dict key that is a tuple nested a few hundred
thousand deep is hashed by recursion in C and kills the process (the service's, in the correctness phase), and the
calls it allows made gigabytes or minutes of work from a few bytes (`check_pickle` lists them). So the pickle is
read opcode by opcode first (pickletools, iterative), with a model of its stack that knows what each object is,
how deep it nests and how many objects it reaches, and refused wherever it is not what torch.save writes.
"""

from __future__ import annotations

import pickletools
import re
import struct
from dataclasses import dataclass
from typing import BinaryIO

import torch


class UnsafeArchiveError(ValueError):
    """The file is not an archive torch.save writes, or is one that the loader could read differently."""


_END = struct.Struct("<4sHHHHIIH")
_ZIP64_LOCATOR = struct.Struct("<4sIQI")
_ZIP64_END = struct.Struct("<4sQHHIIQQQQ")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_END_SIGNATURE = b"PK\x05\x06"
_ZIP64_LOCATOR_SIGNATURE = b"PK\x06\x07"
_ZIP64_END_SIGNATURE = b"PK\x06\x06"
_CENTRAL_SIGNATURE = b"PK\x01\x02"
_LOCAL_SIGNATURE = b"PK\x03\x04"
_ZIP64_EXTRA_ID = 0x0001
_ZIP64_END_RECORD_SIZE = _ZIP64_END.size - 12  # the record's own size field counts what follows it
# General-purpose flags torch.save sets: sizes in a data descriptor after the data (bit 3), UTF-8 names (bit 11).
_ALLOWED_FLAGS = 0x0008 | 0x0800
_U16 = 0xFFFF
_U32 = 0xFFFFFFFF
# torch.save's record names: "<archive>/data.pkl", "<archive>/data/0", "<archive>/.format_version", ...
_RECORD_NAME = re.compile(rb"[A-Za-z0-9_.][A-Za-z0-9_./-]{0,254}")
# Each directory entry: its fixed part, a name of at most 255 bytes, and a zip64 extra field.
_MAX_CENTRAL_ENTRY = _CENTRAL.size + 255 + 32

# The opcodes torch.save (pickle protocol 2) writes, all of which torch's weights-only unpickler reads: objects that
# hold nothing (depth 0), by kind, and empty containers (depth 1); the rest are modelled in `check_pickle`.
_ATOMS = {
    "NONE": "none", "NEWFALSE": "bool", "NEWTRUE": "bool", "BININT": "int", "BININT1": "int", "BININT2": "int",
    "LONG1": "int", "BINFLOAT": "float", "BINUNICODE": "text",
}  # fmt: skip
_EMPTY = {"EMPTY_TUPLE", "EMPTY_LIST", "EMPTY_DICT"}
# The globals torch.save writes for plain dense tensors (pickletools spells them "module name"), by kind: the
# rebuild functions and the empty OrderedDict of backward hooks (called), the storage classes (in storage ids),
# and dtypes that have no storage class (an argument of _rebuild_tensor_v3).
_ORDERED_DICT = "collections OrderedDict"
# The kinds of node that are containers a pickle can fill after making them.
_CONTAINERS = frozenset({"EMPTY_LIST", "EMPTY_DICT", "ordered dict"})
_REBUILDS = frozenset({"torch._utils _rebuild_tensor_v2", "torch._utils _rebuild_tensor_v3"})
_GLOBALS = (
    {name: name for name in (_ORDERED_DICT, *_REBUILDS)}
    | {"torch.storage UntypedStorage": "storage class"}
    | {
        f"torch {n}": "storage class"
        for n in dir(torch)
        if n.endswith("Storage") and isinstance(getattr(torch, n), type)
    }
    | {f"torch {n}": "dtype" for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)}
)


@dataclass(frozen=True)
class Record:
    name: bytes
    header_offset: int
    data_offset: int
    size: int


def _read_at(handle: BinaryIO, offset: int, size: int) -> bytes:
    handle.seek(offset)
    data = handle.read(size)
    if len(data) != size:
        raise UnsafeArchiveError("the archive is truncated")
    return data


def _directory_place(handle: BinaryIO, size: int) -> tuple[int, int, int]:
    """(entries, directory offset, directory size) from the end record, which must be the file's last bytes, and
    from the zip64 one where a locator precedes it; the directory must end where those records begin."""
    if size < _END.size:
        raise UnsafeArchiveError("not a zip archive")
    signature, disk, directory_disk, disk_entries, entries, directory_size, directory_offset, comment = _END.unpack(
        _read_at(handle, size - _END.size, _END.size)
    )
    if signature != _END_SIGNATURE or comment != 0:
        raise UnsafeArchiveError("the archive does not end with its end-of-central-directory record")
    if disk != 0 or directory_disk != 0 or disk_entries != entries:
        raise UnsafeArchiveError("a multi-disk archive")
    directory_end = size - _END.size
    locator_offset = directory_end - _ZIP64_LOCATOR.size
    if locator_offset >= 0 and _read_at(handle, locator_offset, 4) == _ZIP64_LOCATOR_SIGNATURE:
        _, zip64_disk, zip64_offset, disks = _ZIP64_LOCATOR.unpack(
            _read_at(handle, locator_offset, _ZIP64_LOCATOR.size)
        )
        if zip64_disk != 0 or disks != 1 or zip64_offset != locator_offset - _ZIP64_END.size:
            raise UnsafeArchiveError("the zip64 locator does not point just before itself")
        fields = _ZIP64_END.unpack(_read_at(handle, zip64_offset, _ZIP64_END.size))
        signature, record_size, _, _, disk, directory_disk, disk_entries64, entries64, size64, offset64 = fields
        if signature != _ZIP64_END_SIGNATURE or record_size != _ZIP64_END_RECORD_SIZE:
            raise UnsafeArchiveError("a malformed zip64 end-of-central-directory record")
        if disk != 0 or directory_disk != 0 or disk_entries64 != entries64:
            raise UnsafeArchiveError("a multi-disk archive")
        # Each 32-bit field either says "see zip64" or agrees with it, so no reader can take the other value.
        for narrow, wide, sentinel in ((entries, entries64, _U16), (directory_size, size64, _U32),
                                       (directory_offset, offset64, _U32)):  # fmt: skip
            if narrow not in (wide, sentinel):
                raise UnsafeArchiveError("the zip64 and 32-bit end records disagree")
        entries, directory_size, directory_offset, directory_end = entries64, size64, offset64, zip64_offset
    elif _U16 == entries or _U32 in (directory_size, directory_offset):
        raise UnsafeArchiveError("a zip64 field without a zip64 end record")
    if directory_offset + directory_size != directory_end:
        raise UnsafeArchiveError("the central directory does not end where the end-of-central-directory record starts")
    return entries, directory_offset, directory_size


def _zip64_values(extra: bytes, wanted: int) -> list[int]:
    """The first `wanted` 64-bit values of the entry's one zip64 extra field."""
    found: list[int] | None = None
    position = 0
    while position < len(extra):
        if position + 4 > len(extra):
            raise UnsafeArchiveError("a malformed extra field")
        field_id, field_size = struct.unpack_from("<HH", extra, position)
        body = extra[position + 4 : position + 4 + field_size]
        if len(body) != field_size:
            raise UnsafeArchiveError("a malformed extra field")
        if field_id == _ZIP64_EXTRA_ID:
            if found is not None or field_size < 8 * wanted:
                raise UnsafeArchiveError("a malformed zip64 extra field")
            found = list(struct.unpack_from(f"<{wanted}Q", body))
        position += 4 + field_size
    if wanted and found is None:
        raise UnsafeArchiveError("a zip64 field without its extra field")
    return found or []


def records(handle: BinaryIO, size: int, max_records: int) -> list[Record]:
    """The archive's records as miniz will find them, in the central directory's order, or UnsafeArchiveError."""
    if _read_at(handle, 0, 4) != _LOCAL_SIGNATURE:
        raise UnsafeArchiveError("not a torch zip archive")
    entries, directory_offset, directory_size = _directory_place(handle, size)
    if not 0 < entries <= max_records:
        raise UnsafeArchiveError(f"the archive has {entries} records, at most {max_records} are allowed")
    if directory_size > entries * _MAX_CENTRAL_ENTRY:
        raise UnsafeArchiveError("the central directory is larger than its entries")
    directory = _read_at(handle, directory_offset, directory_size)
    found: list[Record] = []
    names: set[bytes] = set()
    position = 0
    for _ in range(entries):
        if position + _CENTRAL.size > len(directory):
            raise UnsafeArchiveError("the central directory is truncated")
        fields = _CENTRAL.unpack_from(directory, position)
        signature, _, _, flags, method, _, _, _, packed, unpacked, name_size, extra_size, comment_size = fields[:13]
        disk, header_offset = fields[14], fields[16]
        name = directory[position + _CENTRAL.size : position + _CENTRAL.size + name_size]
        extra_start = position + _CENTRAL.size + name_size
        extra = directory[extra_start : extra_start + extra_size]
        position = extra_start + extra_size + comment_size
        if signature != _CENTRAL_SIGNATURE or position > len(directory):
            raise UnsafeArchiveError("a malformed central directory entry")
        if flags & ~_ALLOWED_FLAGS or method != 0 or comment_size or disk not in (0, _U16):
            raise UnsafeArchiveError("an archive record that is compressed, encrypted or otherwise not stored plainly")
        # zip64 values follow in this order, each only where its 32-bit field is saturated (APPNOTE 4.5.3).
        narrow = [unpacked, packed, header_offset]
        wide = iter(_zip64_values(extra, sum(value == _U32 for value in narrow)))
        unpacked, packed, header_offset = (next(wide) if value == _U32 else value for value in narrow)
        if disk == _U16:
            raise UnsafeArchiveError("a multi-disk archive")
        if packed != unpacked:
            raise UnsafeArchiveError("an archive record that is compressed")
        if not _RECORD_NAME.fullmatch(name) or name.lower() in names:
            raise UnsafeArchiveError(f"an unexpected or repeated record name {name[:64]!r}")
        names.add(name.lower())
        found.append(Record(name, header_offset, 0, unpacked))
    if position != len(directory):
        raise UnsafeArchiveError("the central directory holds more than its entries")
    placed: dict[bytes, Record] = {}
    end = 0
    for record in sorted(found, key=lambda record: record.header_offset):
        if record.header_offset < end:
            raise UnsafeArchiveError("archive records overlap")
        fields = _LOCAL.unpack(_read_at(handle, record.header_offset, _LOCAL.size))
        signature, _, flags, method, name_size, extra_size = fields[0], fields[1], fields[2], fields[3], *fields[9:]
        data_offset = record.header_offset + _LOCAL.size + name_size + extra_size
        if signature != _LOCAL_SIGNATURE or flags & ~_ALLOWED_FLAGS or method != 0:
            raise UnsafeArchiveError("a local header that does not match the central directory")
        if _read_at(handle, record.header_offset + _LOCAL.size, name_size) != record.name:
            raise UnsafeArchiveError("a local header that does not match the central directory")
        end = data_offset + record.size
        if end > directory_offset:
            raise UnsafeArchiveError("an archive record runs into the central directory")
        placed[record.name] = Record(record.name, record.header_offset, data_offset, record.size)
    return [placed[record.name] for record in found]


def pickle_record(found: list[Record]) -> Record:
    """The record torch.load unpickles: `data.pkl` in the directory named by the first entry of the central
    directory (names are unique without regard to case, so miniz's case-blind lookup finds this one)."""
    archive, slash, _ = found[0].name.partition(b"/")
    wanted = archive.lower() + b"/data.pkl"
    for record in found:
        if slash and record.name.lower() == wanted:
            return record
    raise UnsafeArchiveError("the archive has no data.pkl")


def check(
    handle: BinaryIO, size: int, *, max_records: int, max_pickle_bytes: int, max_nesting: int, max_objects: int
) -> None:
    """Refuse (UnsafeArchiveError) anything but an archive of the shape torch.save writes, whose pickle is at most
    `max_pickle_bytes` long and passes `check_pickle`."""
    found = records(handle, size, max_records)
    data = pickle_record(found)
    if data.size > max_pickle_bytes:
        raise UnsafeArchiveError(f"the archive's pickle has {data.size} bytes, at most {max_pickle_bytes} are allowed")
    storages = data.name[: -len(b"data.pkl")] + b"data/"
    keys = {record.name[len(storages) :].decode() for record in found if record.name.startswith(storages)}
    check_pickle(_read_at(handle, data.data_offset, data.size), max_nesting, max_objects, keys)


class _Node:
    """What the model of the unpickler's stack knows of an object: how deep it nests, how many objects it holds
    counted as often as it is reached (a tuple of one shared tuple twice, 30 levels down, reaches 2^30 of them:
    what hashing it walks), what it is (`kind`), and for a tuple its items' kinds and texts."""

    __slots__ = ("depth", "kind", "parts", "reached", "text")

    def __init__(self, depth: int, reached: int, kind: str, text: str = "", parts: tuple[_Node, ...] = ()) -> None:
        self.depth, self.reached, self.kind, self.text, self.parts = depth, reached, kind, text, parts


def check_pickle(data: bytes, max_nesting: int, max_objects: int, storage_keys: set[str]) -> None:
    """Refuse a pickle that is not one torch.save writes for our runner's data (tensors, numbers, None, lists and
    tuples of them, a dict with string keys). The weights-only unpickler takes far more, and from a few bytes made
    gigabytes or minutes of work: `bytearray` and `_codecs.encode`, a string or storage as the function of a call
    (its repr went into an error message, through a regex quadratic in it), a tuple as a storage's key (formatted
    into a record name), upper- and lower-case spellings of one key (miniz finds the record for each, torch loads a
    copy for each). So: only torch.save's opcodes; globals only where it writes them (a rebuild function or an empty
    OrderedDict called, a storage class in a storage's id, a dtype as an argument); each storage id exactly
    ("storage", class, key, location, size) with `key` one of `storage_keys` as spelled; string dict keys; nothing
    nested deeper than `max_nesting` or reaching more than `max_objects` objects."""

    def holding(items: list[_Node], kind: str) -> _Node:
        return grown(_Node(1, 1, kind, parts=tuple(items) if kind == "tuple" else ()), items)

    def grown(node: _Node, items: list[_Node]) -> _Node:
        node.depth = max([node.depth, *(item.depth + 1 for item in items)])
        node.reached += sum(item.reached for item in items)
        if node.depth > max_nesting:
            raise UnsafeArchiveError(f"the saved data is nested deeper than {max_nesting} levels")
        if node.reached > max_objects:
            raise UnsafeArchiveError(f"the saved data reaches more than {max_objects} objects")
        return node

    def keys_are_text(items: list[_Node]) -> None:
        if any(key.kind != "text" for key in items[::2]) or len(items) % 2:
            raise UnsafeArchiveError("a dict key that is not a string")

    def storage_id(pid: _Node) -> None:
        kinds = tuple(part.kind for part in pid.parts)
        if pid.kind != "tuple" or kinds != ("text", "storage class", "text", "text", "int"):
            raise UnsafeArchiveError('a storage id that is not ("storage", class, key, location, size)')
        if pid.parts[0].text != "storage" or pid.parts[2].text not in storage_keys:
            raise UnsafeArchiveError(f"a storage id naming no record of the archive ({pid.parts[2].text[:40]!r})")

    def filled(container: _Node, opcode: str) -> _Node:
        """A list (APPEND, APPENDS) or a dict (SETITEM, SETITEMS) being filled: never a tensor's backward hooks,
        which torch.save writes empty (a red-team file filled them with 8,000 lists and the tensor itself)."""
        wanted = "EMPTY_LIST" if opcode.startswith("APPEND") else "EMPTY_DICT"
        if container.kind != wanted:
            raise UnsafeArchiveError(f"{opcode} on {container.kind or 'a value'}, which torch.save does not write")
        return container

    def called(function: _Node, arguments: _Node) -> str:
        if function.kind == _ORDERED_DICT and arguments.kind == "EMPTY_TUPLE":
            return "ordered dict"
        if function.kind in _REBUILDS and arguments.kind == "tuple" and arguments.parts[:1]:
            if arguments.parts[0].kind == "storage":
                return "tensor"
        raise UnsafeArchiveError(f"a call torch.save does not write ({function.kind or 'not a function'})")

    stack: list[_Node] = []
    marks: list[list[_Node]] = []
    memo: dict[object, _Node] = {}
    try:
        for opcode, argument, _ in pickletools.genops(data):
            name = opcode.name
            if name == "GLOBAL":
                kind = _GLOBALS.get(str(argument))
                if kind is None:
                    raise UnsafeArchiveError(
                        f"the pickle global {str(argument)[:80]!r}, which torch.save does not write"
                    )
                stack.append(_Node(0, 1, kind))
            elif name in _ATOMS:
                stack.append(_Node(0, 1, _ATOMS[name], str(argument) if name == "BINUNICODE" else ""))
            elif name in _EMPTY:
                stack.append(_Node(1, 1, name))
            elif name == "MARK":
                marks.append(stack)
                stack = []
            elif name == "TUPLE":
                items, stack = stack, marks.pop()
                stack.append(holding(items, "tuple"))
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                count = int(name[-1])
                if len(stack) < count:
                    raise IndexError
                items = stack[-count:]
                del stack[-count:]
                stack.append(holding(items, "tuple"))
            elif name in ("APPENDS", "SETITEMS"):
                items, stack = stack, marks.pop()
                if name == "SETITEMS":
                    keys_are_text(items)
                grown(filled(stack[-1], name), items)
            elif name == "APPEND":
                item = stack.pop()
                grown(filled(stack[-1], name), [item])
            elif name == "SETITEM":
                value, key = stack.pop(), stack.pop()
                keys_are_text([key, value])
                grown(filled(stack[-1], name), [key, value])
            elif name == "REDUCE":
                arguments = stack.pop()
                stack[-1] = holding([stack[-1], arguments], called(stack[-1], arguments))
            elif name == "BINPERSID":
                storage_id(stack[-1])
                stack[-1] = holding([stack[-1]], "storage")
            elif name in ("BINPUT", "LONG_BINPUT"):
                memo[argument] = stack[-1]
            elif name in ("BINGET", "LONG_BINGET"):
                if memo[argument].kind in _CONTAINERS:
                    # torch.save writes each list or dict once; one fetched again could be put inside itself, or a
                    # tensor that holds it inside it: a cycle, which keeps whatever it holds alive after the check
                    # (a mapped output file in the reference's timer, a candidate's tensors in the service).
                    raise UnsafeArchiveError("a list or dict referred to twice")
                stack.append(memo[argument])
            elif name == "PROTO":
                if argument != 2:
                    raise UnsafeArchiveError(f"pickle protocol {argument}, torch.save writes 2")
            elif name == "STOP":
                if len(stack) != 1 or marks:
                    raise UnsafeArchiveError("a pickle that does not end with one object")
            else:
                raise UnsafeArchiveError(f"the pickle opcode {name}, which torch.save does not write")
    except (IndexError, KeyError) as error:
        raise UnsafeArchiveError("a malformed pickle") from error
    except ValueError as error:  # pickletools: a truncated argument or an unknown opcode
        if isinstance(error, UnsafeArchiveError):
            raise
        raise UnsafeArchiveError(f"a malformed pickle ({error})") from error
