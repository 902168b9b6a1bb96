"""Python stacks (--py-stacks) as every output shows them, and the summary's "by Python line".

A call's `Event.py_stack` is the calling thread's Python stack, innermost frame first. Lines
and timelines show its innermost frame; the table "by Python line" attributes each call to
its innermost *user* frame: the innermost one whose file is not the interpreter's library,
an installed package or a pseudo file (LIBRARY_FILES, USER_PSEUDO_FILES), or the innermost frame
when every one is such (a call made from the standard library alone is still placed).

What a row counts, per call (each operation once with both layers traced, as its runtime
call: layers.LayerFilter.outer, as the memory tables count):
- calls and API time (their durations, failed calls included);
- launches: kernels run (a launch a stream capture recorded is not run; a graph launch runs
  the kernels of its nodes, child graphs' too);
- bytes allocated (successful allocators), bytes copied and bytes set (copies and memsets,
  apart);
- sync time: the duration of calls that block the thread until the GPU is done
  (operations.is_blocking: the `sync` rows and synchronous copies), failed ones too (the
  thread waited all the same).
"""
import re
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from ..decode.events import EXIT, Event, PyFrame
from ..decode.operations import blocks, copy_bytes, event_bytes, is_launch, row
from ..spec.apis import Role
from ._table import integer, table
from .layers import LayerFilter

PyStack = Sequence[PyFrame]
# Files that are not the user's code: the interpreter's own library (lib/pythonX.Y, its
# zip), installed packages, and code a compiler generated in its cache (torch.compile's
# Inductor writes its wrappers, which capture and replay CUDA graphs, to
# /tmp/torchinductor_USER/ unless TORCHINDUCTOR_CACHE_DIR names another folder; Triton's
# launchers lie in ~/.triton/cache/); pseudo files (below) are not either.
LIBRARY_FILES = re.compile(r"/(?:site|dist)-packages/|/lib(?:64)?/python\d+(?:\.\d+)?t?"
                           r"(?:/|\.zip/)|/torchinductor(?:_[^/]*)?/|/\.triton/cache/")
# Pseudo file names are in angle brackets (`<frozen importlib._bootstrap>`, `<string>`);
# these prefixes are code a person typed, hence user code all the same.
USER_PSEUDO_FILES = ("<stdin>", "<ipython-input-")
NO_STACK = "(no Python frames)"  # the row of calls made while no Python frame ran
ROWS_SHOWN = 20  # top rows of the table, by API time (as the HTML report's top kernels)
HEADERS = ("Time (%)", "API Time (ns)", "Calls", "Launches", "Allocated (bytes)",
           "Copied (bytes)", "Set (bytes)", "Sync Time (ns)", "Python line")
TITLE = " ** CUDA API by Python Line (innermost user frame):"


def location(frame: PyFrame) -> str:
    """`FILE:LINE` of a frame (`FILE:?` when its line is not known)."""
    return "%s:%s" % (frame.file, "?" if frame.line is None else frame.line)


def frame_text(frame: PyFrame) -> str:
    """`FILE:LINE FUNCTION`: how tables, leaks and timelines name a frame."""
    return "%s %s" % (location(frame), frame.function)


def line_suffix(stack: Optional[PyStack]) -> str:
    """What a text line gains: ` at FILE:LINE (FUNCTION)` of the innermost frame, or ''."""
    if not stack:
        return ""
    return " at %s (%s)" % (location(stack[0]), stack[0].function)


_USER_FILES: Dict[str, bool] = {}  # file → is_user_file (few files, many calls)


def is_user_file(path: str) -> bool:
    """Whether a frame's file is the user's code (see LIBRARY_FILES, USER_PSEUDO_FILES)."""
    known = _USER_FILES.get(path)
    if known is None:
        if len(_USER_FILES) > 65536:  # (bounded: generated code may have many names)
            _USER_FILES.clear()
        known = _USER_FILES[path] = (path.startswith(USER_PSEUDO_FILES) if path.startswith("<")
                                     else LIBRARY_FILES.search(path) is None)
    return known


def user_frame(stack: Optional[PyStack]) -> Optional[PyFrame]:
    """The innermost user frame of a stack, else its innermost frame; None for no stack."""
    if not stack:
        return None
    for frame in stack:
        if is_user_file(frame.file):
            return frame
    return stack[0]


def user_line(stack: Optional[PyStack]) -> str:
    """The key of a stack's row in the table "by Python line"."""
    frame = user_frame(stack)
    return NO_STACK if frame is None else frame_text(frame)


def stack_lines(stack: Optional[PyStack], indent: str = "      ") -> List[str]:
    """One line per frame, innermost first: `py#0 FILE:LINE FUNCTION` (beside the native
    stack's `#0 ...` lines of --stacks)."""
    return ["%spy#%d %s" % (indent, depth, frame_text(frame))
            for depth, frame in enumerate(stack or ())]


def _kernels_run(nodes: Iterable[dict]) -> int:
    """The kernels a graph launch's nodes run (child graphs' too)."""
    count = 0
    for node in nodes:
        if node.get("type") == "kernel":
            count += 1
        elif node.get("type") == "graph" and node.get("nodes"):
            count += _kernels_run(node["nodes"])
    return count


# The columns a row adds up, in HEADERS' order after the share; and what a function's
# successful calls add besides calls and time (its column, None: nothing).
_NS, _CALLS, _LAUNCHES, _ALLOCATED, _COPIED, _SET, _SYNC = range(7)
_COLUMN_OF_ROLE = {Role.LAUNCH: _LAUNCHES, Role.GRAPH_LAUNCH: _LAUNCHES,
                   Role.ALLOC: _ALLOCATED, Role.COPY: _COPIED, Role.MEMSET: _SET}


class _Function(NamedTuple):
    """How the table counts one function's calls (kept per name)."""

    blocking: bool
    column: Optional[int]
    role: Optional[str]


_FUNCTIONS: Dict[str, _Function] = {}


def _function(api: str) -> _Function:
    found = _FUNCTIONS.get(api)
    if found is None:
        table_row = row(api)
        role = table_row.role if table_row is not None else None
        blocking = table_row is not None and blocks(table_row)
        found = _FUNCTIONS[api] = _Function(blocking, _COLUMN_OF_ROLE.get(role), role)
    return found


def _amount(event: Event, function: _Function) -> int:
    """What a successful call adds to its column: kernels run, or bytes."""
    role = function.role
    if role == Role.LAUNCH:
        return 0 if not is_launch(event) or event.outs.get("captured") else 1
    if role == Role.GRAPH_LAUNCH:
        nodes = event.outs.get("nodes")
        return _kernels_run(nodes) if isinstance(nodes, list) else 0
    if role == Role.ALLOC:
        return event_bytes(event) or 0
    return copy_bytes(event) or 0


class PythonLines:
    """Completed calls by innermost user Python frame (see the module's docstring). Feed it
    events with `add`; `seen` says whether any event had a Python stack (the table is shown
    only then); `rows()` and `table()` render it.

    With `always` False it counts nothing until the first event with a Python stack (a
    trace without --py-stacks then costs one test per event): calls before it, made while
    no Python frame ran, are not in the "(no Python frames)" row. True (the CLI's, with
    --py-stacks) counts every call."""

    def __init__(self, always: bool = False) -> None:
        self.seen = False
        self.counting = always
        self.lines: Dict[str, List[int]] = {}
        self._layers = LayerFilter()
        self._keys: Dict[Tuple[PyFrame, ...], str] = {}

    def add(self, events: Iterable[Event]) -> None:
        for event in events:
            self.add_event(event)

    def add_event(self, event: Event) -> None:
        if event.py_stack is not None:
            self.seen = self.counting = True
        if event.phase == EXIT and self.counting:
            for call in self._layers.outer(event):
                self._count(call)

    def _key(self, stack: Optional[PyStack]) -> str:
        if stack is None:
            return NO_STACK
        key = self._keys.get(stack)  # type: ignore[arg-type]
        if key is None:
            if len(self._keys) > 65536:  # (bounded: deep recursion makes many stacks)
                self._keys.clear()
            key = self._keys[stack] = user_line(stack)  # type: ignore[index]
        return key

    def _count(self, event: Event) -> None:
        key = self._key(event.py_stack)
        totals = self.lines.get(key)
        if totals is None:
            totals = self.lines[key] = [0] * 7
        duration = event.duration_ns or 0
        totals[_NS] += duration
        totals[_CALLS] += 1
        function = _function(event.api)
        if function.blocking:
            totals[_SYNC] += duration
        if function.column is not None and not event.ret:
            totals[function.column] += _amount(event, function)
    def ordered(self) -> List[Tuple[str, List[int]]]:
        """Every row (key, totals) by API time, most first (then by key)."""
        for call in self._layers.flush():  # direct driver calls still held back
            self._count(call)
        return sorted(self.lines.items(), key=lambda item: (-item[1][_NS], item[0]))

    def rows(self, limit: Optional[int] = ROWS_SHOWN) -> List[Tuple[str, ...]]:
        """The table's rows as cell strings (HEADERS), the top `limit` by API time."""
        ordered = self.ordered()
        grand = sum(totals[_NS] for _, totals in ordered) or 1
        return [("%.1f" % (100.0 * totals[_NS] / grand),) + tuple(integer(v) for v in totals)
                + (key,) for key, totals in ordered[:limit]]

    def table(self, limit: Optional[int] = ROWS_SHOWN) -> str:
        """The text table, with its title; a note says how many rows were left out."""
        title = TITLE + "\n\n"
        rows = self.rows(limit)
        if not rows:
            return title + " (no completed calls)"
        text = title + table(HEADERS, rows, left=(len(HEADERS) - 1,))
        left_out = len(self.lines) - len(rows)
        if left_out > 0:
            text += "\n (%d more Python line%s not shown)" % (left_out,
                                                             "" if left_out == 1 else "s")
        return text + ("\n\n Python line: each call's innermost frame outside the interpreter's"
                       " library and installed packages;\n Sync Time: synchronising calls "
                       "(cudaStreamSynchronize & co.) and synchronous copies.")
