"""Kernel tracepoints: their ids and record layouts, from tracefs.

tracefs is often not mounted. Rather than mount it for everyone, a short-lived child process
mounts it in a private mount namespace, reads what is needed and exits. What was read is kept
for the rest of the boot in the user's cache folder (`_disk_file`): the private mount costs
3-8 ms of a start, and tens to hundreds on a busy machine.
"""
import ctypes
import marshal
import os
import re
import zlib
from typing import Dict, List, NamedTuple, Optional, Tuple

from ..errors import UnsupportedKernelError

TRACEFS_ROOTS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
CLONE_NEWNS = 0x00020000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
_FIELD = re.compile(r"field:[^;]*?(\w+)(\[\d*\])?;\s*offset:(\d+);\s*size:(\d+);")


class Tracepoint(NamedTuple):
    """A tracepoint's id and its record's fields (name → (offset, size))."""

    name: str
    id: int
    fields: Dict[str, Tuple[int, int]]

    def offset(self, field: str) -> int:
        if field not in self.fields:
            raise UnsupportedKernelError("tracepoint %s has no field %s" % (self.name, field))
        return self.fields[field][0]


def parse_format(text: str) -> Dict[str, Tuple[int, int]]:
    """name → (offset, size) of every field of a tracefs `format` file."""
    return {m.group(1): (int(m.group(3)), int(m.group(4))) for m in _FIELD.finditer(text)}


def find(category: str, name: str) -> Tracepoint:
    """The tracepoint `category:name`; UnsupportedKernelError if tracefs cannot tell."""
    return find_all([(category, name)])[0]


# What was read already: a tracepoint's id and format last as long as the boot, and one
# private mount costs 3-8 ms (much more on a busy machine), so a session's tracepoints are
# read once, together (ReadAhead), and whoever asks again is answered from here.
_known: Dict[Tuple[str, str], Tracepoint] = {}


def find_all(wanted: List[Tuple[str, str]]) -> List[Tracepoint]:
    """The tracepoints (category, name) of `wanted`, read from tracefs (mounted privately,
    once for all of them, when it is not mounted) unless read before."""
    missing = [w for w in dict.fromkeys(wanted) if w not in _from_disk()]
    if missing:
        _known.update(zip(missing, _read(missing)))
        _to_disk()
    return [_known[w] for w in wanted]


_disk_read = False  # whether the file was read into _known (once a process)


def _disk_file() -> Optional[str]:
    """The file of this boot (its id: tracepoint ids are given out at boot) and kernel build,
    in $XDG_CACHE_HOME/ebpf-cuda or ~/.cache/ebpf-cuda."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return None
    uname = os.uname()
    build = "%s|%s|%s" % (boot, uname.release, uname.version)
    digest = "%08x%08x" % (zlib.crc32(build.encode()), zlib.adler32(build.encode()))
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ebpf-cuda", "tracepoints-%s.marshal" % digest)


def _from_disk() -> Dict[Tuple[str, str], Tracepoint]:
    """`_known`, with what this boot's file holds (read once; not when it is not this
    user's alone, or not sound)."""
    global _disk_read
    if _disk_read:
        return _known
    _disk_read = True
    path = _disk_file()
    try:
        with open(path or "", "rb") as f:
            info = os.fstat(f.fileno())
            stored = marshal.load(f) if info.st_uid == os.geteuid() and not (
                info.st_mode & 0o022) else {}
        for (category, name), (number, fields) in dict(stored).items():
            point = Tracepoint("%s:%s" % (category, name), int(number), {
                str(field): (int(at), int(size)) for field, (at, size) in fields.items()})
            _known.setdefault((str(category), str(name)), point)
    except (OSError, ValueError, EOFError, TypeError, AttributeError):
        pass
    return _known


def _to_disk() -> None:
    """Replace this boot's file with what is known (a write that fails: read again later)."""
    path = _disk_file()
    if path is None:
        return
    temporary = "%s.%d.tmp" % (path, os.getpid())
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            marshal.dump({key: (point.id, point.fields) for key, point in _known.items()}, f)
        os.replace(temporary, path)
    except (OSError, ValueError):
        try:
            os.unlink(temporary)
        except OSError:
            pass


def _read(wanted: List[Tuple[str, str]]) -> List[Tracepoint]:
    root = _mounted_root()
    if root is not None:
        return [_from_texts(category, name,
                            *_read_texts(os.path.join(root, "events", category, name)))
                for category, name in wanted]
    texts = _PrivateMount(wanted).texts()
    return [_from_texts(category, name, *pair) for (category, name), pair in zip(wanted, texts)]


def _mounted_root() -> Optional[str]:
    return next((root for root in TRACEFS_ROOTS if os.path.isdir(os.path.join(root, "events"))),
                None)


class ReadAhead:
    """The tracepoints a session will need, read while it does other work: where tracefs is
    not mounted, the child that mounts it privately starts now and `wait()` takes its answer
    (into what find_all knows). What it could not read, find_all reads again, and says why."""

    def __init__(self, wanted: List[Tuple[str, str]]) -> None:
        wanted = [w for w in wanted if w not in _from_disk()]
        self._wanted = wanted
        self._reading: Optional[_PrivateMount] = None
        if wanted and _mounted_root() is None:
            try:
                self._reading = _PrivateMount(wanted)
            except OSError:  # (no fork now: find_all tries again, and says why)
                pass

    def wait(self) -> None:
        """Take the answer (idempotent; also when the session ends before it is needed)."""
        reading, self._reading = self._reading, None
        if reading is None:
            return
        try:
            texts = reading.texts()
            found = [_from_texts(category, name, *pair)
                     for (category, name), pair in zip(self._wanted, texts)]
        except (UnsupportedKernelError, OSError):
            return
        _known.update(zip(self._wanted, found))
        _to_disk()


def _read_texts(folder: str) -> Tuple[str, str]:
    try:
        with open(os.path.join(folder, "id")) as f_id, \
                open(os.path.join(folder, "format")) as f:
            return f_id.read(), f.read()
    except OSError:
        return "", ""  # no such tracepoint: _from_texts says so


def _from_texts(category: str, name: str, id_text: str, format_text: str) -> Tracepoint:
    try:
        return Tracepoint("%s:%s" % (category, name), int(id_text), parse_format(format_text))
    except ValueError:
        raise UnsupportedKernelError("tracepoint %s:%s has no readable id" % (category, name))


class _PrivateMount:
    """A child that mounts tracefs where only it sees it and writes the tracepoints' texts
    to a pipe; `texts()` waits for them."""

    def __init__(self, wanted: List[Tuple[str, str]]) -> None:
        self.wanted = wanted
        # Its usual mount point exists, empty, in sysfs; a temporary folder only when not.
        folder = next((root for root in TRACEFS_ROOTS if os.path.isdir(root)), None)
        self.made = folder is None
        if folder is None:
            import tempfile

            folder = tempfile.mkdtemp(prefix="ebpf-cuda-tracefs-")
        self.folder = folder
        read_end, write_end = os.pipe()
        try:
            self.pid = os.fork()
        except OSError:
            os.close(read_end)
            os.close(write_end)
            self._remove_folder()
            raise
        if self.pid == 0:
            _child(wanted, folder, read_end, write_end)
        os.close(write_end)
        self.read_end = read_end

    def texts(self) -> List[Tuple[str, str]]:
        """(id, format) of each tracepoint; UnsupportedKernelError when none could be read."""
        with os.fdopen(self.read_end, "rb") as f:
            data = f.read()
        os.waitpid(self.pid, 0)
        self._remove_folder()
        if not data:
            raise UnsupportedKernelError(
                "tracepoint %s: tracefs is not mounted and could not be mounted privately"
                % ", ".join("%s:%s" % w for w in self.wanted))
        texts = data.decode().split("\0")  # id, format, id, format... (neither holds a NUL)
        return list(zip(texts[0::2], texts[1::2]))

    def _remove_folder(self) -> None:
        if self.made:
            os.rmdir(self.folder)


def _child(wanted: List[Tuple[str, str]], folder: str, read_end: int, write_end: int) -> None:
    """In the forked child: mount, read, write, exit (never returns)."""
    status = 1
    try:
        os.close(read_end)
        libc = ctypes.CDLL(None, use_errno=True)
        if (libc.unshare(CLONE_NEWNS) == 0
                and libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0
                and libc.mount(b"nodev", folder.encode(), b"tracefs", 0, None) == 0):
            texts = [text for category, name in wanted for text in
                     _read_texts(os.path.join(folder, "events", category, name))]
            os.write(write_end, "\0".join(texts).encode())
            status = 0
    except BaseException:
        pass
    finally:
        os._exit(status)
