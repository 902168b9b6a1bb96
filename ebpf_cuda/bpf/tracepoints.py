"""Kernel tracepoints: their ids and record layouts, from tracefs.

tracefs is often not mounted. Rather than mount it for everyone, a short-lived child process
mounts it in a private mount namespace, reads what is needed and exits.
"""
import ctypes
import os
import re
from typing import Dict, List, NamedTuple, Tuple

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


def find_all(wanted: List[Tuple[str, str]]) -> List[Tracepoint]:
    """The tracepoints (category, name) of `wanted`, read from tracefs (mounted privately,
    once for all of them, when it is not mounted)."""
    for root in TRACEFS_ROOTS:
        if os.path.isdir(os.path.join(root, "events")):
            return [_from_texts(category, name,
                                *_read_texts(os.path.join(root, "events", category, name)))
                    for category, name in wanted]
    texts = _read_in_private_mount(wanted)
    return [_from_texts(category, name, *pair) for (category, name), pair in zip(wanted, texts)]


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


def _read_in_private_mount(wanted: List[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """Mount tracefs where only a child process sees it, and read the tracepoints there."""
    # Its usual mount point exists, empty, in sysfs; a temporary folder only when it does not.
    folder = next((root for root in TRACEFS_ROOTS if os.path.isdir(root)), None)
    made = folder is None
    if made:
        import tempfile

        folder = tempfile.mkdtemp(prefix="ebpf-cuda-tracefs-")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
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
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    if made:
        os.rmdir(folder)
    if not data:
        raise UnsupportedKernelError("tracepoint %s: tracefs is not mounted and could not be "
                                     "mounted privately" % ", ".join("%s:%s" % w for w in wanted))
    texts = data.decode().split("\0")  # id, format, id, format... (neither holds a NUL)
    return list(zip(texts[0::2], texts[1::2]))
