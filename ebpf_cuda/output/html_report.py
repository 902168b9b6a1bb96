"""One self-contained HTML page: summary tables and inline SVG plots, no scripts, no fetches.

Events are aggregated as they come (per-function counters, log2 duration histograms, time
buckets that widen as the trace grows; memory grows only with the pointers allocated); the
page is written at `close()`. Copies, launches and memory are counted by the same analyses
as `--summary` and `--leaks` (analysis/): with both layers traced each operation counts
once, and the memory section is the leak tracker's (its allocations, frees, double frees).
Kernels are counted as the summary's kernel table counts them (graphs.py): a launch a stream
capture recorded into a graph did not run then (it is counted as captured), and each graph
launch runs the kernels of its nodes (counted as launches, and as run in graphs). With
--py-stacks, calls by Python line as the summary has them, and each leak's innermost frame.
"""
import html
from typing import IO, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..analysis.gpu import GpuState
from ..analysis.layers import LayerFilter
from ..analysis.memory import LeakTracker
from ..analysis.python_lines import HEADERS as PY_HEADERS
from ..analysis.python_lines import PythonLines, frame_text
from ..decode.events import EXIT, Event
from ..decode.operations import copy_bytes, copy_label, copy_operation, is_launch
from ..spec.apis import BY_NAME, Role
from . import finish

Namer = Callable[[Event, int], Optional[str]]  # (event, function address) -> kernel name

MAX_BUCKETS = 120  # time buckets in the over-time plots
_KEEP_MAX = (False, False, True)  # calls and bytes add up per bucket; live memory peaks
FIRST_BUCKET_NS = 1_000_000  # 1 ms; doubled until the trace fits in MAX_BUCKETS


class FunctionStats:
    """Calls, failures and durations of one function."""

    def __init__(self) -> None:
        self.calls = 0
        self.errors = 0
        self.total_ns = 0
        self.min_ns: Optional[int] = None
        self.max_ns = 0
        self.histogram: Dict[int, int] = {}  # log2(duration ns) -> calls

    def add(self, ev: Event) -> None:
        duration = ev.duration_ns or 0
        self.calls += 1
        self.errors += 1 if ev.ret else 0
        self.total_ns += duration
        self.min_ns = duration if self.min_ns is None else min(self.min_ns, duration)
        self.max_ns = max(self.max_ns, duration)
        bucket = max(duration, 1).bit_length() - 1
        self.histogram[bucket] = self.histogram.get(bucket, 0) + 1


class TimeSeries:
    """Per-interval sums over time, with a bucket width that doubles to keep at most
    MAX_BUCKETS buckets (so memory does not grow with the trace)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.start_ns: Optional[int] = None
        self.width_ns = FIRST_BUCKET_NS
        self.buckets: List[List[int]] = []

    def add(self, ts_ns: int, values: Sequence[int], keep_max: Sequence[bool] = ()) -> None:
        if self.start_ns is None:
            self.start_ns = ts_ns
        index = max(ts_ns - self.start_ns, 0) // self.width_ns
        while index >= MAX_BUCKETS:
            self._widen(keep_max)
            index //= 2
        while len(self.buckets) <= index:
            self.buckets.append([0] * len(self.names))
        row = self.buckets[index]
        for i, value in enumerate(values):
            row[i] = max(row[i], value) if i < len(keep_max) and keep_max[i] else row[i] + value

    def _widen(self, keep_max: Sequence[bool]) -> None:
        merged = []
        for i in range(0, len(self.buckets), 2):
            pair = self.buckets[i:i + 2]
            merged.append([max(col) if j < len(keep_max) and keep_max[j] else sum(col)
                           for j, col in enumerate(zip(*pair))])
        self.buckets = merged
        self.width_ns *= 2

    def column(self, name: str) -> List[int]:
        i = self.names.index(name)
        return [row[i] for row in self.buckets]


class HtmlReport:
    """A sink that writes the HTML report to `stream` when closed (the stream is closed
    too unless it is stdout or stderr). `namer(event, address)` names kernels."""

    def __init__(self, stream: IO[str], namer: Optional[Namer] = None,
                 title: str = "ebpf-cuda report", py_stacks: bool = False) -> None:
        self.stream = stream
        self.namer = namer
        self.title = title
        self.functions: Dict[str, FunctionStats] = {}
        self.kernels: Dict[str, List[int]] = {}  # name -> [launches run, calls' total ns]
        self.graph_kernels: Dict[str, List[int]] = {}  # name -> [run in graphs, captured]
        self.copies: Dict[str, List[int]] = {}  # direction -> [calls, bytes, total ns]
        self.errors: Dict[Tuple[str, str], int] = {}
        self.processes: Dict[int, str] = {}
        self.memory = LeakTracker(keep_timeline=False, on_change=self._live_changed)
        self.series = TimeSeries(["calls", "copied", "live"])
        self._live: Dict[int, int] = {}  # pid -> live bytes
        self._copy_layers = LayerFilter()  # a copy counts as its runtime call
        self._launch_layers = LayerFilter()  # a launch as its driver call
        self._graph_layers = LayerFilter()  # cudaGraphLaunch's cuGraphLaunch: one launch
        self.events = 0
        from ..analysis.collectives import CollectiveSummary  # (the text summary's table)

        self.collectives = CollectiveSummary()  # NCCL calls per function and communicator
        self.first_ns: Optional[int] = None
        self.last_ns = 0
        self.lost = ""  # what the report did not see, in words (note_losses)
        # --py-stacks: calls by Python line, as the summary's table (`py_stacks`: see it)
        self.python_lines = PythonLines(py_stacks)
        self.gpu = GpuState()  # the GPU's samples and events (note_gpu)
        # --analyze: the analysis/analyzer.Analyzer fed the same events (its section)
        self.analyzer = None

    def header(self) -> None:
        """Nothing is written before the end."""

    def note_losses(self, losses) -> None:
        """Told before the end what the trace lost (losses.Losses): shown at the top."""
        self.lost = losses.read().sentence()

    def note_gpu(self, records: List) -> None:
        """The GPU's samples and events (gpu/records.py), plotted beside the calls."""
        self.gpu.note_gpu(records)

    def write(self, events: Iterable[Event]) -> None:
        events = events if isinstance(events, list) else list(events)
        self.gpu.write(events)
        for ev in events:
            self.events += 1
            self.processes.setdefault(ev.pid, ev.comm)
            if self.first_ns is None:
                self.first_ns = ev.ts_ns
            self.last_ns = max(self.last_ns, ev.ts_ns)
            if ev.py_stack is not None or ev.phase == EXIT:
                self.python_lines.add_event(ev)
            if ev.phase == EXIT:
                self._call(ev)

    def _call(self, ev: Event) -> None:
        self.functions.setdefault(ev.api, FunctionStats()).add(ev)
        self.collectives.add(ev)
        self.series.add(ev.ts_ns, (1, 0, 0), keep_max=_KEEP_MAX)
        self.memory.feed(ev)
        if ev.ret:
            key = (ev.api, ev.ret_name or str(ev.ret))
            self.errors[key] = self.errors.get(key, 0) + 1
        elif is_launch(ev):
            if self._launch_layers.inner(ev):
                self._kernel(ev)
        elif ev.outs.get("nodes") and _is_graph_launch(ev):
            if self._graph_layers.inner(ev):
                self._graph_ran(ev.outs["nodes"])
        elif copy_operation(ev) is not None:
            for copy in self._copy_layers.outer(ev):
                self._copy(copy)

    def _copy(self, ev: Event) -> None:
        """Count a successful copy (memsets are not copies)."""
        direction, size = copy_label(copy_operation(ev) or ""), copy_bytes(ev)
        if direction is None or size is None:
            return
        row = self.copies.setdefault(direction, [0, 0, 0])
        row[0] += 1
        row[1] += size
        row[2] += ev.duration_ns or 0
        self.series.add(ev.ts_ns, (0, size, 0), keep_max=_KEEP_MAX)

    def _live_changed(self, ev: Event, live: int) -> None:
        self._live[ev.pid] = live
        self.series.add(ev.ts_ns, (0, 0, sum(self._live.values())), keep_max=_KEEP_MAX)

    def _kernel(self, ev: Event) -> None:
        address = ev.args["func"]
        name = self.namer(ev, address) if self.namer is not None else None
        name = name or "0x%x" % address
        row = self.kernels.setdefault(name, [0, 0])
        if ev.outs.get("captured"):  # recorded into a graph: it runs at the graph's launches
            self.graph_kernels.setdefault(name, [0, 0])[1] += 1
            return
        row[0] += 1
        row[1] += ev.duration_ns or 0

    def _graph_ran(self, nodes: List[dict]) -> None:
        """Count the kernels a graph launch ran (its nodes', child graphs' too)."""
        for node in nodes:
            if node.get("type") == "kernel":
                name = node.get("kernel") or "0x%x" % (node.get("func") or 0)
                self.kernels.setdefault(name, [0, 0])[0] += 1
                self.graph_kernels.setdefault(name, [0, 0])[0] += 1
            elif node.get("type") == "graph" and node.get("nodes"):
                self._graph_ran(node["nodes"])

    def close(self) -> None:
        for copy in self._copy_layers.flush():  # direct driver copies still held back
            self._copy(copy)
        self.memory.flush()
        self.stream.write(render(self))
        finish(self.stream)


def _is_graph_launch(ev: Event) -> bool:
    row = BY_NAME.get(ev.api)
    return row is not None and row.role == Role.GRAPH_LAUNCH


def write_html_report(events: Iterable[Event], stream: IO[str],
                      namer: Optional[Namer] = None) -> None:
    """Write the report of any iterable of events to `stream` (closed unless stdout/stderr)."""
    report = HtmlReport(stream, namer)
    report.write(events)
    report.close()


# -- rendering ------------------------------------------------------------------------------

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0} td,th{padding:3px 10px;text-align:right}
th{background:#f0f0f0} td:first-child,th:first-child{text-align:left}
tr:nth-child(even) td{background:#fafafa} .err{color:#b00}
.plots{display:flex;flex-wrap:wrap;gap:16px} figure{margin:0}
figcaption{font-size:12px;color:#555} svg text{font:10px sans-serif;fill:#444}
"""


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _ms(ns: float) -> str:
    return "%.3f" % (ns / 1e6)


def _us(ns: float) -> str:
    return "%.1f" % (ns / 1e3)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """An HTML table; cells are escaped."""
    head = "".join("<th>%s</th>" % _esc(h) for h in headers)
    body = "".join("<tr>%s</tr>" % "".join("<td>%s</td>" % _esc(c) for c in row)
                   for row in rows)
    return "<table><tr>%s</tr>%s</table>" % (head, body)


def bar_chart(values: Sequence[float], labels: Sequence[str], caption: str,
              width: int = 520, height: int = 160, color: str = "#4a7bd0") -> str:
    """Vertical bars with a tooltip each (inline SVG)."""
    top = max(values) if values and max(values) > 0 else 1
    n = max(len(values), 1)
    step = (width - 50) / n
    bars = []
    for i, (value, label) in enumerate(zip(values, labels)):
        h = (height - 30) * value / top
        bars.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s">'
                    '<title>%s: %s</title></rect>' % (45 + i * step, height - 20 - h,
                                                      max(step - 1, 1), h, color,
                                                      _esc(label), _esc(_num(value))))
    axis = ('<text x="2" y="12">%s</text><text x="2" y="%d">0</text>'
            '<text x="45" y="%d">%s</text><text x="%d" y="%d" text-anchor="end">%s</text>'
            % (_esc(_num(top)), height - 20, height - 5, _esc(labels[0] if labels else ""),
               width - 5, height - 5, _esc(labels[-1] if labels else "")))
    return _figure(width, height, "".join(bars) + axis, caption)


def hbar_chart(items: Sequence[Tuple[str, float]], caption: str, width: int = 520,
               color: str = "#d08a4a") -> str:
    """Horizontal bars, one per (label, value)."""
    top = max((v for _, v in items), default=0) or 1
    rows, height = [], 18 * len(items) + 10
    for i, (label, value) in enumerate(items):
        w = (width - 230) * value / top
        rows.append('<text x="2" y="%d">%s</text><rect x="180" y="%d" width="%.1f" height="14"'
                    ' fill="%s"><title>%s: %s</title></rect><text x="%.1f" y="%d">%s</text>'
                    % (18 * i + 16, _esc(label[:32]), 18 * i + 5, w, color, _esc(label),
                       _esc(_num(value)), 184 + w, 18 * i + 16, _esc(_num(value))))
    return _figure(width, height, "".join(rows), caption)


def _figure(width: int, height: int, body: str, caption: str) -> str:
    return ('<figure><svg width="%d" height="%d" viewBox="0 0 %d %d" role="img">%s</svg>'
            '<figcaption>%s</figcaption></figure>' % (width, height, width, height, body,
                                                      _esc(caption)))


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else "%.3g" % value


def render(report: HtmlReport) -> str:
    """The whole page."""
    warning = ('<p class="lost"><strong>Not counted:</strong> %s</p>' % _esc(report.lost)
               if report.lost else "")
    parts = [warning, _overview(report), _analysis_section(report), _function_table(report),
             _time_plots(report), _gpu_section(report), _histograms(report),
             _copy_table(report), _memory_table(report),
             _kernel_section(report), _python_table(report), _nccl_table(report),
             _error_table(report)]
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<title>%s</title><style>%s</style></head><body><h1>%s</h1>%s</body></html>\n'
            % (_esc(report.title), _STYLE, _esc(report.title), "".join(parts)))


def _overview(r: HtmlReport) -> str:
    calls = sum(f.calls for f in r.functions.values())
    span = (r.last_ns - r.first_ns) if r.first_ns is not None else 0
    procs = ", ".join("%s (%d)" % (comm, pid) for pid, comm in sorted(r.processes.items()))
    return "<h2>Overview</h2>" + table(["", "value"], [
        ("events", r.events), ("calls", calls),
        ("failed calls", sum(r.errors.values())), ("trace span (ms)", _ms(span)),
        ("processes", procs or "none")])


def _function_table(r: HtmlReport) -> str:
    rows = [(name, f.calls, f.errors, _ms(f.total_ns), _us(f.total_ns / f.calls),
             _us(f.min_ns or 0), _us(f.max_ns))
            for name, f in sorted(r.functions.items(), key=lambda kv: -kv[1].total_ns)]
    return "<h2>Calls by function</h2>" + table(
        ["function", "calls", "errors", "total (ms)", "mean (us)", "min (us)", "max (us)"],
        rows)


def _time_plots(r: HtmlReport) -> str:
    s = r.series
    if not s.buckets:
        return ""
    width_ms = s.width_ns / 1e6
    labels = ["%.3g ms" % (i * width_ms) for i in range(len(s.buckets))]
    return ("<h2>Over time</h2><div class=\"plots\">%s%s%s</div>" % (
        bar_chart(s.column("calls"), labels, "calls per %.3g ms" % width_ms),
        bar_chart(s.column("copied"), labels, "bytes copied per %.3g ms" % width_ms,
                  color="#4aa070"),
        bar_chart(s.column("live"), labels, "live allocated memory (bytes, peak per interval)",
                  color="#a04a90")))


def _gpu_section(r: HtmlReport) -> str:
    """Per device, its utilisation and memory in the calls' time buckets (the plots above),
    then the memory gap and device event tables."""
    gpu, s = r.gpu, r.series
    if not gpu.samples and not gpu.events:
        return ""
    times = [x.ts_ns for x in gpu.samples] or [0]
    start = s.start_ns if s.start_ns is not None else min(times)
    count = max(len(s.buckets), 1)
    width = s.width_ns if s.buckets else max((max(times) - start) // count + 1, 1)
    labels = ["%.3g ms" % (i * width / 1e6) for i in range(count)]
    figures = []
    for device in sorted({x.device for x in gpu.samples}):
        for key, what, color in (("gpu_util", "utilisation (%, mean)", "#d04a4a"),
                                 ("mem_used", "memory used (bytes, mean)", "#4a7bd0")):
            sums, counts = [0.0] * count, [0] * count
            for x in gpu.samples:
                i = (x.ts_ns - start) // width
                if x.device == device and key in x.values and 0 <= i < count:
                    sums[i] += x.values[key]
                    counts[i] += 1
            figures.append(bar_chart([v / n if n else 0 for v, n in zip(sums, counts)],
                                     labels, "GPU %d %s per %.3g ms" % (device, what,
                                                                       width / 1e6),
                                     color=color))
    gaps = table(["pid", "GPU", "NVML peak (bytes)", "live allocations then (bytes)",
                  "gap (bytes)"], [(g.pid, g.device, g.nvml, g.live, g.gap)
                                   for g in gpu.peak_gaps()]) if gpu.peak_gaps() else ""
    events = table(["time", "GPU", "event", "last launches"], [
        ("%.6f" % e.ts, e.device, e.sentence().split(";")[0],
         ", ".join("%s %s (pid %d)" % (l["api"], l.get("kernel") or "", l["pid"])
                   for l in e.last_launches)) for e in gpu.events]) if gpu.events else ""
    return "<h2>GPU state (NVML)</h2><div class=\"plots\">%s</div>%s%s" % (
        "".join(figures), gaps, events)


def _histograms(r: HtmlReport) -> str:
    figures = []
    for name, f in sorted(r.functions.items()):
        low, high = min(f.histogram), max(f.histogram)
        values = [f.histogram.get(b, 0) for b in range(low, high + 1)]
        labels = [_duration_label(1 << b) for b in range(low, high + 1)]
        figures.append(bar_chart(values, labels, "%s: calls by duration (log2 buckets)" % name,
                                 width=340, height=120))
    if not figures:
        return ""
    return "<h2>Duration histograms</h2><div class=\"plots\">%s</div>" % "".join(figures)


def _duration_label(ns: int) -> str:
    if ns < 1000:
        return "%d ns" % ns
    if ns < 1000000:
        return "%.3g us" % (ns / 1e3)
    return "%.3g ms" % (ns / 1e6)


def _copy_table(r: HtmlReport) -> str:
    if not r.copies:
        return ""
    rows = [(d, calls, size, _ms(ns), "%.2f" % (size / ns) if ns else "-")
            for d, (calls, size, ns) in sorted(r.copies.items())]
    return "<h2>Memory copies</h2>" + table(
        ["direction", "calls", "bytes", "total (ms)", "GB/s"], rows)


def _memory_table(r: HtmlReport) -> str:
    m = r.memory
    pids = m.pids()
    if not pids and not m.warnings:
        return ""
    leaks = m.leaks()
    rows = [(pid, r.processes.get(pid, "?"), m.peak_bytes(pid), m.live_bytes(pid),
             sum(1 for a in leaks if a.pid == pid)) for pid in pids]
    text = "<h2>Allocated memory (device, managed, pinned host)</h2>" + table(
        ["pid", "process", "peak live bytes", "live at end (bytes)", "leaked allocations"],
        rows)
    text += "<p>allocations: %d</p><p>frees: %d</p><p>double frees: %d</p>" % (
        m.allocations, m.releases, m.double_frees)
    if leaks:
        shown = leaks[:100]
        headers = ["pid", "pointer", "bytes", "allocated by"]
        rows = [[a.pid, "0x%x" % a.ptr, a.size, a.api] for a in shown]
        if any(a.py_stack for a in shown):  # --py-stacks: where in Python each one was made
            headers.append("Python frame")
            for cells, a in zip(rows, shown):
                cells.append(frame_text(a.py_stack[0]) if a.py_stack else "")
        text += "<h2>Leaks (not freed by the end)</h2>" + table(headers, rows)
    return text


def _python_table(r: HtmlReport) -> str:
    """Calls by innermost user Python frame (--py-stacks), as the text summary's table."""
    if not r.python_lines.seen:
        return ""
    rows = r.python_lines.rows()
    if not rows:
        return ""
    # (the line first, as every table here has its key first)
    return ("<h2>Calls by Python line (innermost user frame)</h2>"
            + table((PY_HEADERS[-1],) + PY_HEADERS[:-1], [(row[-1],) + row[:-1] for row in rows])
            + "<p>Each call counts at its innermost frame outside the interpreter's library "
              "and installed packages; sync time: synchronising calls and synchronous "
              "copies.</p>")


def _kernel_section(r: HtmlReport) -> str:
    if not r.kernels:
        return ""
    graphs = r.graph_kernels
    top = sorted(r.kernels.items(),
                 key=lambda kv: (-kv[1][0], -graphs.get(kv[0], (0, 0))[1], kv[0]))[:20]
    if not graphs:  # (no graphs: the table as it was)
        text = table(["kernel", "launches", "launch calls total (ms)"],
                     [(name, n, _ms(ns)) for name, (n, ns) in top])
    else:
        text = table(["kernel", "launches", "in graphs", "captured", "launch calls total (ms)"],
                     [(name, n) + tuple(graphs.get(name, (0, 0))) + (_ms(ns),)
                      for name, (n, ns) in top]) + (
            "<p>launches: kernels run, eager or by graph launches (in graphs: of those); "
            "captured: launches a stream capture recorded into a graph (not run then).</p>")
    return ("<h2>Top kernels</h2>" + text
            + hbar_chart([(name, row[0]) for name, row in top], "launches per kernel"))


def _nccl_table(r: HtmlReport) -> str:
    """NCCL calls per function and communicator, as the text summary's NCCL table."""
    if not r.collectives:
        return ""
    return ("<h2>NCCL (host-side time of the calls)</h2>"
            + table(list(r.collectives.HEADERS), r.collectives.rows()))


def _error_table(r: HtmlReport) -> str:
    if not r.errors:
        return ""
    rows = [(api, name, n) for (api, name), n in sorted(r.errors.items(), key=lambda kv: -kv[1])]
    return '<h2 class="err">Failed calls</h2>' + table(["function", "error", "calls"], rows)


def _analysis_section(r: HtmlReport) -> str:
    """--analyze: the findings, then each loop's steps (analysis/analyzer.py)."""
    if r.analyzer is None:
        return ""
    from ..analysis.analyzer import step_rows, unmatched

    findings = r.analyzer.findings()
    text = "<h2>Findings (--analyze)</h2>"
    if not findings:
        text += "<p>No finding.</p>"
    else:
        text += table(["severity", "rule", "what", "evidence", "where", "change"], [
            (f.severity, f.rule, f.title, f.summary,
             "; ".join("%s: %s" % (k, v) for k, v in f.where.items() if v not in (None, [])),
             f.advice) for f in findings])
    if not r.analyzer.context().loops and r.analyzer.step_at is not None:
        text += "<p>Steps: none: %s</p>" % _esc(unmatched(r.analyzer.step_at))
    for loop in r.analyzer.context().loops:
        text += "<h2>Steps of thread %d/%d: %d (%s)</h2>" % (loop.pid, loop.tid,
                                                            len(loop.steps), _esc(loop.how))
        text += table(["per step", "p50", "p95", "p99", "total"], step_rows(loop))
    return text
