"""From events to answers: kernel names, memory correlation and leaks, summaries.

Every class here works on any iterable of events (a live tracer, a saved trace, a test's
hand-made list) and never prints: reports are returned as strings. The names below are
imported from their modules on first use (the CLI's start-up needs only the kernel namer).
"""
import importlib
from typing import Any

_HOMES = {
    "kernels": ("AddressResolver", "Frame", "ProcessMaps"),
    "memory": ("ALLOCATORS", "FREES", "Allocation", "Allocator", "LeakTracker", "MemoryWarning",
               "format_leaks", "format_stack"),
    "python_lines": ("PythonLines", "frame_text", "user_frame", "user_line"),
    "summary": ("Summary", "copy_operation", "percentile", "stats"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(list(_MODULE_OF) + ["KernelNamer"])


def __getattr__(name: str) -> Any:
    if name == "KernelNamer":  # its home is names.py (the one store of kernel names)
        from ..names import KernelNamer

        return KernelNamer
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    return getattr(importlib.import_module("." + module, __name__), name)
