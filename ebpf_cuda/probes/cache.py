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
MAX_ENTRIES = 4096  # past it the file starts again empty (each trace config adds its rows)
KEEP_FILES = 8  # files of other package or kernel builds kept beside the newest (upgrades)
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
    digest = "%08x%08x" % (zlib.crc32(build.encode()), zlib.adler32(build.encode()))
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # (a relative one is ignored, as the XDG spec says)
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ebpf-cuda", "programs-%s.marshal" % digest)


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


def spec_key(spec: ProgramSpec, arch: Arch) -> str:
    """What the bytecode of `spec` depends on (with the package's build: the file's)."""
    return repr((spec.kind, spec.api.name, spec.fn_id, arch, spec.options))


class ProgramCache:
    """The programs of one file (`path`; None: none, every program generated): `program()`
    from it or made, `save()` those made."""

    def __init__(self, path: Optional[str] = "") -> None:
        self._path = path  # "": this package's and kernel's file, found on first use
        self._stored: Optional[Dict[str, Entry]] = None  # read on first use
        self._new: Dict[str, Entry] = {}

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
        entry = self._entries().get(spec_key(spec, arch))
        if entry is None:
            return None
        code = bytearray(entry[0])
        try:
            for at, map_name in entry[1]:
                _IMM.pack_into(code, at, getattr(maps[map_name], "fd", maps[map_name]))
        except (KeyError, TypeError, ValueError, struct.error):
            return None  # (a map this session does not have: generated anew)
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

    def save(self) -> None:
        """Write what `keep()` added to the file, replaced at once (never half written)."""
        if not self._new or self.path is None:
            return
        entries = dict(self._entries())
        if len(entries) + len(self._new) > MAX_ENTRIES:
            entries = {}
        entries.update(self._new)
        self._new = {}
        folder = os.path.dirname(self.path)
        temporary = "%s.%d.tmp" % (self.path, os.getpid())
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(marshal.dumps(entries))
            os.replace(temporary, self.path)
        except (OSError, ValueError):
            try:
                os.unlink(temporary)
            except OSError:
                pass
        else:
            _prune(folder, os.path.basename(self.path))
        self._stored = entries

    @property
    def path(self) -> Optional[str]:
        if self._path == "":
            self._path = cache_file()
        return self._path

    def _entries(self) -> Dict[str, Entry]:
        if self._stored is None:
            self._stored = _read(self.path)
        return self._stored


def _prune(folder: str, kept: str) -> None:
    """Remove all but the KEEP_FILES newest program files of other builds (each upgrade of
    the package or the kernel starts a file: the folder must not grow without end)."""
    try:
        others = [entry for entry in os.scandir(folder) if entry.name != kept
                  and entry.name.startswith("programs-") and entry.name.endswith(".marshal")]
        others.sort(key=lambda entry: entry.stat().st_mtime, reverse=True)
        for entry in others[KEEP_FILES:]:
            os.unlink(entry.path)
    except OSError:
        pass  # (another start pruning at once, or a folder not ours to tidy)


def _read(path: Optional[str]) -> Dict[str, Entry]:
    """The file's entries: none when it is missing, unreadable, not marshal's, or not this
    user's alone (its bytecode is loaded into the kernel)."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if info.st_uid != os.geteuid() or info.st_mode & 0o022:
                return {}
            stored = marshal.loads(f.read())
    except (OSError, ValueError, EOFError, TypeError):
        return {}
    if not isinstance(stored, dict):
        return {}
    return {key: entry for key, entry in stored.items() if _valid(key, entry)}


def _valid(key: object, entry: object) -> bool:
    return (isinstance(key, str) and isinstance(entry, tuple) and len(entry) == 2
            and isinstance(entry[0], bytes) and isinstance(entry[1], list)
            and all(isinstance(ref, tuple) and len(ref) == 2 and isinstance(ref[0], int)
                    and isinstance(ref[1], str) and 0 <= ref[0] <= len(entry[0]) - 4
                    for ref in entry[1]))
