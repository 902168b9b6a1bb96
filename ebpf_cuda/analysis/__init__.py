"""From events to answers: kernel names, memory correlation and leaks, summaries.

Every class here works on any iterable of events (a live tracer, a saved trace, a test's
hand-made list) and never prints: reports are returned as strings. The names below are
imported from their modules on first use (the CLI's start-up needs only the kernel namer).
"""
import importlib
from typing import Any

_HOMES = {
    "..targets.symbols": ("AddressResolver", "Frame", "ProcessMaps"),
    "..decode.names": ("KernelNamer",),
    "memory": ("ALLOCATORS", "FREES", "Allocation", "Allocator", "LeakTracker", "MemoryWarning",
               "format_leaks", "format_stack"),
    "python_lines": ("PythonLines", "frame_text", "user_frame", "user_line"),
    "summary": ("Summary", "copy_operation"),
    "statistics": ("Stats", "percentile", "stats"),
    "analyzer": ("Analyzer",),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    relative = module if module.startswith(".") else "." + module
    return getattr(importlib.import_module(relative, __name__), name)
