"""The assembled call programs of earlier starts, kept on disk: generating and assembling a
default trace's ~26 programs is ~20 ms of Python on every start, for the same bytes each time.

One file per package build and kernel build (`cache_file`), in $XDG_CACHE_HOME/ebpf-cuda or
~/.cache/ebpf-cuda, holds each program's bytecode by what generated it (the plan's kind, the
row, its function id, the architecture and the `ProbeOptions`: all that
`ProgramSpec.instructions` reads) with the places of its map references (ld_imm64 with
BPF_PSEUDO_MAP_FD or _VALUE), which are patched with this session's map fds. The package's
build is every module file's size and time: a changed generator never meets the programs of
the old one. What cannot be read (missing, corrupt, not this user's) is generated anew; what
cannot be written only makes the next start slower. The kernel verifies every program as
before.

The file gathers the programs of every trace configuration run (each adds its rows, up to
MAX_ENTRIES): a start reads its index and only the entries it needs (`Index`), not the whole
file. Whole, a file of 1,044 entries (a test suite's configurations) took 12 ms to read at
every start and 3.6 MiB held for the session. Layout: MAGIC, the entry count, one index row
a program (8-byte digest of its key, offset, length), then each entry as marshal's bytes of
(key, bytecode, map references): the key in the entry makes a digest that collides a miss.
"""
import marshal
import os
import struct
import zlib
from typing import Any, Dict, List, Optional, Tuple

from ..arch import Arch
from ..bpf.programs import Program
from .plan import ProgramSpec

_LD_IMM64 = 0x18  # BPF_LD | BPF_IMM | BPF_DW: a 64-bit load, two instruction slots
_MAP_REFS = (1, 2)  # its src_reg for a map's fd: BPF_PSEUDO_MAP_FD, BPF_PSEUDO_MAP_VALUE
_IMM = struct.Struct("<i")
MAGIC = b"ebpfcuP1"
_HEAD = struct.Struct("<8sI")  # MAGIC, entries
_ROW = struct.Struct("<QII")  # digest, offset, length
MAX_ENTRIES = 4096  # past it only this start's programs are kept (each config adds its rows)
KEEP_FILES = 8  # files of other package or kernel builds kept beside the newest (upgrades)
SUFFIX = ".programs"
Entry = Tuple[bytes, List[Tuple[int, str]]]  # bytecode, (byte offset of an imm, map name)


def cache_file(package: Optional[str] = None) -> Optional[str]:
    """This package build's and this kernel build's file; None when the package is not
    files in a folder (a zipapp run from its archive)."""
    package = package or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    stamp = _package_stamp(package)
    if stamp is None:
        return None
    uname = os.uname()
    build = "%s|%s|%s|%s" % (uname.release, uname.version, uname.machine, stamp)
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # (a relative one is ignored, as the XDG spec says)
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ebpf-cuda", "programs-%016x%s" % (digest(build), SUFFIX))


def _package_stamp(package: str) -> Optional[str]:
    """Every module's path, size and time under `package` (~1 ms: stat only)."""
    parts: List[str] = []
    try:
        for folder, dirs, files in os.walk(package):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    info = os.stat(os.path.join(folder, name))
                    parts.append("%s:%d:%d" % (name, info.st_size, info.st_mtime_ns))
    except OSError:
        return None
    return ",".join(parts) if parts else None


def digest(text: str) -> int:
    """64 bits of `text` (zlib's two checksums: hashlib's import costs a start ~2 ms)."""
    data = text.encode()
    return zlib.crc32(data) << 32 | zlib.adler32(data)


def spec_key(spec: ProgramSpec, arch: Arch) -> str:
    """What the bytecode of `spec` depends on (with the package's build: the file's)."""
    return repr((spec.kind, spec.api.name, spec.fn_id, arch, spec.options))


class Index:
    """A file's index, read once: `entry(key)` reads that one entry (None: not there, or
    not sound). The file is opened again for each entry and checked as the index was: one
    replaced meanwhile by another start's is read as that file (its key must match)."""

    def __init__(self, path: Optional[str]) -> None:
        self.path = path
        self.rows: Dict[int, Tuple[int, int]] = {}  # digest -> (offset, length)
        fd = _open(path)
        if fd is None:
            return
        try:
            head = os.pread(fd, _HEAD.size, 0)
            magic, count = _HEAD.unpack(head) if len(head) == _HEAD.size else (b"", 0)
            table = os.pread(fd, count * _ROW.size, _HEAD.size) if magic == MAGIC else b""
            if len(table) == count * _ROW.size:
                self.rows = {d: (at, size) for d, at, size in _ROW.iter_unpack(table)}
        finally:
            os.close(fd)

    def entry(self, key: str) -> Optional[Entry]:
        row = self.rows.get(digest(key))
        fd = _open(self.path) if row is not None else None
        if fd is None:
            return None
        try:
            stored = _decode(os.pread(fd, row[1], row[0]))
        finally:
            os.close(fd)
        return stored[1] if stored is not None and stored[0] == key else None


class ProgramCache:
    """The programs of one file (`path`; None: none, every program generated): `program()`
    from it or made, `save()` those made."""

    def __init__(self, path: Optional[str] = "") -> None:
        self._path = path  # "": this package's and kernel's file, found on first use
        self._index: Optional[Index] = None  # read on first use
        self._new: Dict[str, Entry] = {}
        self._used: Dict[str, Entry] = {}  # (kept when the file is full)

    def program(self, spec: ProgramSpec, arch: Arch, maps: Dict[str, Any],
                name: str) -> Program:
        """`spec`'s program: from the file, its map references patched, else generated and
        assembled (and kept for `save()`)."""
        found = self._read(spec, arch, maps, name)
        if found is not None:
            return found
        program = Program(spec.instructions(arch), maps, name=name,
                          expected_attach_type=spec.attach_type)
        self._keep(spec, arch, program)
        return program

    def _read(self, spec: ProgramSpec, arch: Arch, maps: Dict[str, Any],
              name: str) -> Optional[Program]:
        key = spec_key(spec, arch)
        entry = self.index().entry(key)
        if entry is None:
            return None
        code = bytearray(entry[0])
        try:
            for at, map_name in entry[1]:
                _IMM.pack_into(code, at, getattr(maps[map_name], "fd", maps[map_name]))
        except (KeyError, TypeError, ValueError, struct.error):
            return None  # (a map this session does not have: generated anew)
        self._used[key] = entry
        return Program.from_bytes(bytes(code), name=name,
                                  expected_attach_type=spec.attach_type)

    def _keep(self, spec: ProgramSpec, arch: Arch, program: Program) -> None:
        """Remember a generated program (assembled here) for `save()`."""
        by_fd = {fd: name for name, fd in program.map_fds().items()}
        code = program.code
        refs: List[Tuple[int, str]] = []
        for at in range(0, len(code) - 15, 8):
            if code[at] == _LD_IMM64 and code[at + 1] >> 4 in _MAP_REFS:
                fd = _IMM.unpack_from(code, at + 4)[0]
                if fd not in by_fd:
                    return  # (a raw fd: nothing to patch it from)
                refs.append((at + 4, by_fd[fd]))
        self._new[spec_key(spec, arch)] = (code, refs)

    @property
    def path(self) -> Optional[str]:
        if self._path == "":
            self._path = cache_file()
        return self._path

    def index(self) -> Index:
        if self._index is None:
            self._index = Index(self.path)
        return self._index

    def save(self) -> None:
        """Write what `keep()` added to the file, replaced at once (never half written)."""
        if not self._new or self.path is None:
            return
        entries = _read(self.path)
        if len(entries) + len(self._new) > MAX_ENTRIES:
            entries = dict(self._used)
        entries.update(self._new)
        self._new = {}
        if _write(self.path, entries):
            _prune(os.path.dirname(self.path), os.path.basename(self.path))
        self._index = None  # (read again: the file is new)


def _open(path: Optional[str]) -> Optional[int]:
    """The file, open, when it is this user's alone (its bytecode is loaded into the
    kernel); else None."""
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        os.close(fd)
        return None
    return fd


def _read(path: Optional[str]) -> Dict[str, Entry]:
    """Every sound entry of the file ({} when it is missing, unreadable or not this user's
    alone): what a save keeps."""
    index = Index(path)
    entries: Dict[str, Entry] = {}
    fd = _open(path) if index.rows else None
    if fd is None:
        return entries
    try:
        for at, size in index.rows.values():
            stored = _decode(os.pread(fd, size, at))
            if stored is not None:
                entries[stored[0]] = stored[1]
    finally:
        os.close(fd)
    return entries


def _write(path: str, entries: Dict[str, Entry]) -> bool:
    blobs = [(digest(key), marshal.dumps((key, code, refs)))
             for key, (code, refs) in entries.items()]
    rows, at = [], _HEAD.size + _ROW.size * len(blobs)
    for key_digest, blob in blobs:
        rows.append(_ROW.pack(key_digest, at, len(blob)))
        at += len(blob)
    data = b"".join([_HEAD.pack(MAGIC, len(blobs))] + rows + [blob for _, blob in blobs])
    temporary = "%s.%d.tmp" % (path, os.getpid())
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
        return True
    except (OSError, ValueError):
        try:
            os.unlink(temporary)
        except OSError:
            pass
        return False


def _prune(folder: str, kept: str) -> None:
    """Remove all but the KEEP_FILES newest program files of other builds (each upgrade of
    the package or the kernel starts a file: the folder must not grow without end); files
    of the earlier whole-marshal format (.marshal) go with them."""
    try:
        others = [entry for entry in os.scandir(folder) if entry.name != kept
                  and entry.name.startswith("programs-")
                  and entry.name.endswith((SUFFIX, ".marshal"))]
        others.sort(key=lambda entry: (entry.name.endswith(SUFFIX), entry.stat().st_mtime),
                    reverse=True)
        for entry in others[KEEP_FILES:]:
            os.unlink(entry.path)
    except OSError:
        pass  # (another start pruning at once, or a folder not ours to tidy)


def _decode(data: bytes) -> Optional[Tuple[str, Entry]]:
    """An entry's (key, (bytecode, references)) from its bytes; None when not sound."""
    try:
        stored = marshal.loads(data)
    except (ValueError, EOFError, TypeError):
        return None
    if not (isinstance(stored, tuple) and len(stored) == 3 and isinstance(stored[0], str)
            and _valid(stored[1:])):
        return None
    return stored[0], (stored[1], stored[2])


def _valid(entry: object) -> bool:
    """A (bytecode, references) pair whose references lie inside the bytecode."""
    return (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], bytes)
            and isinstance(entry[1], list)
            and all(isinstance(ref, tuple) and len(ref) == 2 and isinstance(ref[0], int)
                    and isinstance(ref[1], str) and 0 <= ref[0] <= len(entry[0]) - 4
                    for ref in entry[1]))
