"""Where a process's C library puts pthread_self() relative to the thread pointer (--py-stacks).

CPython keeps pthread_self() in each thread state; the probe knows a thread only by the
thread pointer the kernel keeps for it. On x86-64 the two are equal (TLS_TCB_AT_TP). On
arm64 (TLS_DTV_AT_TP) glibc's thread descriptor lies sizeof(struct pthread) below the
pointer, a size that changes between glibc builds: glibc states it for debuggers as
libthread_db's `_thread_db_const_thread_area` (the constant a debugger subtracts from the
thread register: aarch64's tls.h, `CONST_THREAD_AREA (64, sizeof (struct pthread))`), in
libc.so.6 from glibc 2.34, libpthread.so.0 before. It is read from the files the process
itself maps (a container may carry another glibc), as data, never loaded.
"""
import os
from typing import Dict, List, Optional, Tuple

from .discovery import process_file_path, process_mappings
from .python_layouts import file_identity, symbol_u32

_LIBRARIES = ("libc.so", "libc-2.", "libpthread.so", "libpthread-")
MAX_PTHREAD = 1 << 16  # a larger "size" is no struct pthread: the symbol means another thing
_cache: Dict[Tuple[str, int, int, int], Optional[int]] = {}


class NoThreadConstant(Exception):
    """The process's C library does not say where pthread_self() lies (not glibc: musl)."""


def thread_below_pointer(pid: int, symbol: str) -> int:
    """How many bytes below its thread pointer a thread of process `pid` has pthread_self(),
    from `symbol` in the C library the process maps (libc.so.6, else libpthread.so.0, also
    when only beside libc). NoThreadConstant with a one-line reason when none has it;
    ProcessError when the process is gone."""
    files: List[str] = []
    for mapping in process_mappings(pid):
        name = os.path.basename(mapping.path)
        if mapping.is_file and name.startswith(_LIBRARIES):
            path = process_file_path(pid, mapping.path, mapping.inode)
            if path not in files:
                files.append(path)
    for path in list(files):  # (glibc before 2.34: libthread_db's symbols in libpthread)
        if os.path.basename(path).startswith("libc"):
            beside = os.path.join(os.path.dirname(path), "libpthread.so.0")
            if beside not in files and os.path.exists(beside):
                files.append(beside)
    for path in files:
        value = _constant(path, symbol)
        if value is not None and 0 < value < MAX_PTHREAD:
            return value
    if not files:
        raise NoThreadConstant("it maps no shared C library (a static or musl program?): "
                               "where its pthread_self() lies is not known")
    raise NoThreadConstant("its C library (%s) does not state where pthread_self() lies "
                           "(no %s: not glibc?)" % (", ".join(files), symbol))


def _constant(path: str, symbol: str) -> Optional[int]:
    """The u32 `symbol` of file `path`, cached per (path, device, inode, mtime)."""
    identity = file_identity(path)
    if identity is None:
        return None
    key = (path + "\0" + symbol,) + identity
    if key not in _cache:
        _cache[key] = symbol_u32(path, symbol)
    return _cache[key]
