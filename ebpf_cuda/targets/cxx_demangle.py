"""C++ demangling: `__cxa_demangle` of the C++ runtime (libstdc++ or libc++) through ctypes,
loaded on first use; a name comes back unchanged when no runtime is found.
"""
import ctypes
import functools
from typing import Iterator, Optional


def _cxx_runtimes() -> Iterator[Optional[str]]:
    """C++ runtimes that may export __cxa_demangle, the usual names first (find_library runs
    ldconfig or gcc: only when those fail)."""
    import ctypes.util

    yield "libstdc++.so.6"
    yield ctypes.util.find_library("stdc++")
    yield "libc++.so.1"
    yield ctypes.util.find_library("c++")


class _Demangler:
    """`__cxa_demangle` from the C++ runtime through ctypes, loaded on first use."""

    def __init__(self) -> None:
        self._demangle = None
        self._free = None
        self._loaded = False

    def _load(self) -> None:
        self._loaded = True
        for name in _cxx_runtimes():
            if not name:
                continue
            try:
                lib = ctypes.CDLL(name)
                func = getattr(lib, "__cxa_demangle")  # getattr: avoids name mangling
                libc = ctypes.CDLL(None)
            except (OSError, AttributeError):
                continue
            func.restype = ctypes.c_void_p
            func.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_int)]
            libc.free.argtypes = [ctypes.c_void_p]
            libc.free.restype = None
            self._demangle, self._free = func, libc.free
            return

    def __call__(self, name: str) -> Optional[str]:
        if not self._loaded:
            self._load()
        if self._demangle is None:
            return None
        status = ctypes.c_int(0)
        result = self._demangle(name.encode("utf-8", "replace"), None, None,
                                ctypes.byref(status))
        if not result:
            return None
        try:
            text = ctypes.string_at(result)
        finally:
            self._free(result)
        return text.decode("utf-8", "replace") if status.value == 0 else None


_demangler = _Demangler()


@functools.lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """C++ demangled form of `name` (`_Z6vecAddPKfS0_Pfi` -> `vecAdd(float const*, ...)`);
    the name unchanged when it is not mangled or no C++ runtime is available."""
    if not name.startswith("_Z") or "\0" in name:
        return name
    return _demangler(name) or name
