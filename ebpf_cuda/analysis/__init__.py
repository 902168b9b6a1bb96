"""From events to answers: kernel names, memory correlation and leaks, summaries.

Every class here works on any iterable of events (a live tracer, a saved trace, a test's
hand-made list) and never prints: reports are returned as strings.
"""
from .kernels import AddressResolver, Frame, KernelNamer, ProcessMaps
from .memory import (ALLOCATORS, FREES, Allocation, Allocator, LeakTracker, MemoryWarning,
                     format_leaks, format_stack)
from .summary import Summary, copy_operation, percentile, stats

__all__ = ["AddressResolver", "Frame", "KernelNamer", "ProcessMaps", "ALLOCATORS", "FREES",
           "Allocation", "Allocator", "LeakTracker", "MemoryWarning", "format_leaks",
           "format_stack", "Summary", "copy_operation", "percentile", "stats"]
