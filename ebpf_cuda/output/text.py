"""Text lines in the seed tool's layout: time, process, pid, function, [ENTER]/[EXIT], details.

    TIME            PROCESS          PID     EVENT                TYPE     DETAILS
    16:40:01.123456 basic02          4242    cudaMalloc            [ENTER] size=4000 bytes
    16:40:01.123470 basic02          4242    cudaMalloc             [EXIT] returned=cudaSuccess ptr=0x7f2a00000000 (12.3 us)

With --py-stacks a line ends with ` at FILE:LINE (FUNCTION)`: the innermost Python frame of
the thread that made the call (both lines of a call: they share the stack).
"""
import time
from typing import IO, Any, Callable, Dict, Iterable, List, Optional

from ..decode.events import ENTER, Decoder, Event
from ..decode.values import field_kinds
from ..decode.values import text as value_text
from ..spec.apis import BY_NAME
from . import LineWriter

HEADER_WITH_TIME = "%-15s %-16s %-7s %-20s %8s %s" % ("TIME", "PROCESS", "PID", "EVENT", "TYPE",
                                                      "DETAILS")
HEADER_NO_TIME = "%-16s %-7s %-20s %8s %s" % ("PROCESS", "PID", "EVENT", "TYPE", "DETAILS")

Namer = Callable[[Event, int], Optional[str]]  # (event, address) -> kernel name


def format_value(kind: str, value: Any) -> str:
    """A value as shown in the details column (values.text)."""
    return value_text(kind, value)


_KINDS_CACHE: Dict[str, Dict[str, str]] = {}


def details(event: Event, kernel_name: Optional[str] = None) -> str:
    """The details column: arguments at entry; return name, out-parameters and duration at exit."""
    kinds = _KINDS_CACHE.get(event.api)
    if kinds is None:
        kinds = _KINDS_CACHE[event.api] = field_kinds(BY_NAME[event.api])
    if event.phase == ENTER:
        parts = []
        for name, value in event.args.items():
            shown = value_text(kinds.get(name, ""), value)
            if name == "func" and kernel_name:
                shown = kernel_name
            parts.append("%s=%s" % (name, shown))
        return " ".join(parts)
    parts = ["returned=%s" % event.ret_name]
    parts += ["%s=%s" % (name, value_text(kinds.get(name, ""), v))
              for name, v in event.outs.items()]
    parts += ["%s=<unreadable>" % name for name in event.faults]
    parts.append("(%.1f us)" % (event.duration_ns / 1000.0))
    return " ".join(parts)


def _line_suffix(stack) -> str:
    """analysis.python_lines.line_suffix, imported at the first Python stack (--py-stacks),
    not by every trace's start."""
    global _line_suffix
    from ..analysis.python_lines import line_suffix

    _line_suffix = line_suffix
    return line_suffix(stack)


def format_event(event: Event, timestamps: bool = True, kernel_name: Optional[str] = None,
                 container: Optional[str] = None) -> str:
    """One line for one event (no newline); `container`: the one to name near its end; last,
    with --py-stacks, ` at FILE:LINE (FUNCTION)` of the innermost Python frame."""
    tag = "[ENTER]" if event.phase == ENTER else "[EXIT]"
    text = details(event, kernel_name)
    if event.tid != event.pid:
        text += " tid=%d" % event.tid
    if container:
        text += " container=%s" % container
    if event.py_stack:
        text += _line_suffix(event.py_stack)
    line = "%-16s %-7d %-20s %8s %s" % (event.comm, event.pid, event.api, tag, text)
    if timestamps:
        line = "%s %s" % (_time_text(event), line)
    return line


def _time_text(event: Event) -> str:
    """HH:MM:SS.ffffff: from the wall-clock ns when the decoder gave them (exact: the
    microseconds truncated as the ns say), else from the float seconds."""
    if event.wall_ns is not None:
        second, ns = divmod(event.wall_ns, 1_000_000_000)
        return "%s.%06d" % (time.strftime("%H:%M:%S", time.localtime(second)), ns // 1000)
    return "%s.%06d" % (time.strftime("%H:%M:%S", time.localtime(event.ts)),
                        int(event.ts * 1e6) % 1000000)


class TextWriter(LineWriter):
    """Writes events as lines to a stream, in batches."""

    def __init__(self, stream: IO[str], timestamps: bool = True,
                 namer: Optional[Namer] = None) -> None:
        super().__init__(stream, namer)
        self.timestamps = timestamps

    def header(self) -> None:
        self.stream.write((HEADER_WITH_TIME if self.timestamps else HEADER_NO_TIME) + "\n")

    def lines(self, events: Iterable[Event]) -> List[str]:
        """The lines of some events (no newlines)."""
        lines = []
        containers = self.context.containers
        for ev in events:
            name = None
            if self.namer is not None and "func" in ev.args:
                name = self.namer(ev, ev.args["func"])
            # (not the tracer's own container: each line would say it)
            shown = containers.shown(ev.pid) if containers is not None else None
            lines.append(format_event(ev, self.timestamps, name, shown))
        return lines

    def gpu_lines(self, records: List) -> List[str]:
        """The GPU's events (an Xid, an ECC error) as lines (its samples are for the
        summary, the timeline and JSON)."""
        lines = []
        for record in records:
            if getattr(record, "kind", None) is not None:
                line = "[GPU EVENT] " + record.sentence()
                if self.timestamps:
                    clock = time.strftime("%H:%M:%S", time.localtime(record.ts))
                    line = "%s.%06d %s" % (clock, int(record.ts * 1e6) % 1000000, line)
                lines.append(line)
        return lines

    def _frame_lines(self, decoder: Decoder):
        from .lines import TextLines

        return TextLines(decoder.table, decoder, self.slow_lines, self.namer, self.timestamps,
                         self.context)
