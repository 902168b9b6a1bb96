"""ebpf-cuda: trace CUDA runtime and driver API calls with eBPF uprobes, in pure Python.

    import ebpf_cuda

    with ebpf_cuda.Tracer(command=["./app"], functions=["cudaMalloc", "cudaFree"]) as tracer:
        for event in tracer.events(timeout=10):
            print(event.api, event.phase, event.args, event.ret_name)

The public names below are imported on first use (PEP 562), so `import ebpf_cuda` itself
loads nothing else, has no side effects and never imports click. See docs/api.md.
"""
from typing import TYPE_CHECKING, Any, Dict, List

_PUBLIC: Dict[str, str] = {
    "Tracer": "tracer",
    "TraceConfig": "spec.config",
    "Event": "decode.events",
    "Decoder": "decode.events",
    "ENTER": "decode.events",
    "EXIT": "decode.events",
    "TracerError": "errors",
    "KernelError": "errors",
    "PrivilegeError": "errors",
    "AttachError": "errors",
    "UsageError": "errors",
    "DecodeError": "errors",
    "Summary": "analysis",
    "LeakTracker": "analysis",
    "KernelNamer": "analysis",
    "ChromeTraceWriter": "output.chrome_trace",
    "write_chrome_trace": "output.chrome_trace",
    "HtmlReport": "output.html_report",
    "write_html_report": "output.html_report",
    "JsonWriter": "output.jsonl",
    "TextWriter": "output.text",
    "SavedTrace": "output.savefile",
    "load": "output.savefile",
    "open_save": "output.savefile",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:  # for type checkers and IDEs only
    from .analysis import KernelNamer, LeakTracker, Summary
    from .decode.events import ENTER, EXIT, Decoder, Event
    from .errors import (AttachError, DecodeError, KernelError, PrivilegeError, TracerError,
                         UsageError)
    from .output.chrome_trace import ChromeTraceWriter, write_chrome_trace
    from .output.html_report import HtmlReport, write_html_report
    from .output.jsonl import JsonWriter
    from .output.savefile import SavedTrace, load, open_save
    from .output.text import TextWriter
    from .spec.config import TraceConfig
    from .tracer import Tracer


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError("module 'ebpf_cuda' has no attribute %r" % name)
    import importlib

    value = getattr(importlib.import_module("." + module, __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_PUBLIC))
