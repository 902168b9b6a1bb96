"""`ebpf-cuda analyze` and `--analyze`: the sink that keeps the calls (timeline.py), then
finds the steps (steps.py), the wait bounds (waits.py) and the findings (rules.py), and
renders them as text (`report()`) or JSON records (`records()`). Live and saved traces go
through the same sink, so they give the same findings."""
import json
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ..decode.events import Event
from ._table import integer, table
from .findings import Context, Finding, capture_sites, per_step
from .rules import graph_saving, run_rules
from .statistics import percentile
from .steps import Loop, find_loops
from .timeline import Namer, StackFrames, Timeline
from .waits import derive

TITLE = " ** Analysis (ebpf-cuda analyze)"


class Analyzer:
    """Sink: feed it events; `context()` analyses them once (at the first report)."""

    analyzes = True  # (output/plan.py: its report is its own)

    def __init__(self, namer: Optional[Namer] = None, step_at: Optional[str] = None,
                 as_json: bool = False, label: Optional[str] = None,
                 stacks: Optional[StackFrames] = None) -> None:
        self.timeline = Timeline(namer, stacks)  # (stacks: --stacks' native callers)
        self.step_at = step_at
        self.as_json = as_json  # report() gives JSON lines (records())
        self.label = label  # the file analysed (several ranks' files: each its own)
        self._context: Optional[Context] = None
        self._findings: Optional[List[Finding]] = None

    def header(self) -> None:
        """Nothing is written before the end."""

    def write(self, events: Iterable[Event]) -> None:
        self.timeline.add(events)

    def close(self) -> None:
        """The analysis is made when it is asked for (report, records)."""

    def add(self, events: Iterable[Event]) -> None:
        self.write(events)

    def context(self) -> Context:
        if self._context is None:
            self.timeline.finish()
            loops, warm_ups = find_loops(self.timeline.threads, self.step_at)
            waits = derive(self.timeline.calls)
            self._context = Context(self.timeline, loops, waits,
                                    capture_sites(self.timeline.calls), warm_ups)
        return self._context

    def findings(self) -> List[Finding]:
        if self._findings is None:
            self._findings = run_rules(self.context())
        return self._findings

    def records(self) -> List[Dict[str, Any]]:
        """JSON records: one `steps` record per loop, then one `finding` record each."""
        ctx = self.context()
        out = [_steps_record(ctx, loop) for loop in ctx.loops]
        if self.step_at is not None and not ctx.loops:
            out.append({"type": "no_steps", "step_at": self.step_at,
                        "reason": unmatched(self.step_at)})
        out += [{"type": "warm_up", "pid": loop.pid, "tid": loop.tid,
                 "repeats": len(loop.steps), "found_by": loop.how} for loop in ctx.warm_ups]
        out += [{"type": "graph_replays", "captured_at": site, "replays": n}
                for site, n in sorted(replays_by_capture(ctx).items())]
        out += [f.to_json() for f in self.findings()]
        if self.label:
            for record in out:
                record["file"] = self.label
        return out

    def report(self, _aggregates=None) -> str:
        """The text report: steps, waits, graph replays, elapsed times, findings (JSON
        lines of `records()` when made with as_json)."""
        if self.as_json:
            return "\n".join(json.dumps(record, sort_keys=True) for record in self.records())
        ctx = self.context()
        parts = [TITLE + (" of %s" % self.label if self.label else "")]
        parts += [steps_text(loop, ctx) for loop in ctx.loops] or [
            " Steps: none: " + unmatched(self.step_at) if self.step_at is not None else
            " Steps: none found (no sequence of calls repeats; --step-at FUNCTION names the "
            "step)"]
        parts += [warm_up_text(loop) for loop in ctx.warm_ups]
        parts.append(waits_text(ctx))
        replays = graphs_text(ctx)
        if replays:
            parts.append(replays)
        elapsed = elapsed_text(ctx)
        if elapsed:
            parts.append(elapsed)
        findings = self.findings()
        parts.append(" Findings: %d" % len(findings) + "".join(
            "\n\n " + f.text().replace("\n", "\n ") for f in findings))
        return "\n\n".join(parts)


def unmatched(step_at: str) -> str:
    """What a --step-at that started no step matched: nothing (one line)."""
    return ("--step-at %s matched nothing: no call of a CUDA function %s, no frame of a "
            "function %s in the Python (--py-stacks) or native (--stacks) stacks recorded"
            % (step_at, step_at, step_at))


def _pcts(values: Sequence[float]) -> List[int]:
    ordered = sorted(values)
    return [int(percentile(ordered, p)) for p in (50, 95, 99)]


def _steps_record(ctx: Context, loop: Loop) -> Dict[str, Any]:
    steps = loop.steps
    eager = [s for s in loop.steady() if s.mode == "eager"]
    launch_ns, one, save, measured = graph_saving(ctx, eager)
    return {"type": "steps", "pid": loop.pid, "tid": loop.tid, "steps": len(steps),
            "found_by": loop.how, "where": loop.where,
            "wall_ns_p50_p95_p99": _pcts([s.wall_ns for s in steps]),
            "blocked_ns_p50": _pcts([s.blocked_ns for s in steps])[0],
            "launches_p50": _pcts([len(s.launches) for s in steps])[0],
            "modes": [s.mode for s in steps],
            "deviating": {str(k): v for k, v in loop.deviating.items()},
            "eager_launch_ns_p50": launch_ns, "graphs_would_save_ns": save,
            "graph_launch_ns": one, "graph_launch_measured": measured}


def step_rows(loop: Loop) -> List[Tuple[str, ...]]:
    """(figure, p50, p95, p99, total) rows of a loop's steps, as cell strings."""
    rows = []
    for name, value in (("wall (ns)", lambda s: s.wall_ns),
                        ("host blocked (ns)", lambda s: s.blocked_ns),
                        ("host busy (ns)", lambda s: s.wall_ns - s.blocked_ns),
                        ("GPU-bound share (%)",  # (the share of the step the host waited)
                         lambda s: 100.0 * s.blocked_ns / s.wall_ns if s.wall_ns else 0),
                        ("launches", lambda s: len(s.launches)),
                        ("graph launches", lambda s: len(s.graph_launches)),
                        ("copies", lambda s: len(s.copies)),
                        ("copied (bytes)", lambda s: sum(c.bytes for c in s.copies)),
                        ("allocations", lambda s: len(s.allocations)),
                        ("frees", lambda s: len(s.frees))):
        values = per_step(loop.steps, value)
        total = "-" if name.endswith("(%)") else integer(sum(values))
        rows.append((name,) + tuple(integer(v) for v in _pcts(values)) + (total,))
    return rows


def steps_text(loop: Loop, ctx: Optional[Context] = None) -> str:
    """A loop's steps: how found, where, the per-step figures (p50/p95/p99 over all
    steps), modes and the steps that deviate."""
    steps = loop.steps
    head = " Steps of thread %d/%d: %d, found as %s%s" % (
        loop.pid, loop.tid, len(steps), loop.how,
        "; loop at %s" % loop.where if loop.where else "")
    rows = step_rows(loop)
    text = head + "\n\n" + table(("per step", "p50", "p95", "p99", "total"), rows, left=(0,))
    modes: Dict[str, List[int]] = {}
    for step in steps:
        modes.setdefault(step.mode, []).append(step.number)
    text += "\n\n Mode of each step: " + "; ".join(
        "%s: %s" % (mode, _numbers(numbers))  # (in the order the modes came)
        for mode, numbers in sorted(modes.items(), key=lambda item: item[1][0]))
    eager = [s for s in loop.steady() if s.mode == "eager"]
    if ctx is not None and eager:
        launch_ns, one, save, measured = graph_saving(ctx, eager)
        text += ("\n Eager steps: launch calls take %s ns a step (median); one graph launch "
                 "(%s ns, %s) instead would save ~%s ns a step"
                 % (integer(launch_ns), integer(one), "measured" if measured
                    else "as one kernel launch", integer(save)))
    if loop.deviating:
        text += "\n Steps that deviate:" + "".join(
            "\n   step %d: %s" % item for item in sorted(loop.deviating.items()))
    return text


def warm_up_text(loop: Loop) -> str:
    return (" Thread %d/%d: no steps; its calls repeated (%d times, %s) only before its "
            "process replayed CUDA graphs in a loop: the warm-up" % (
                loop.pid, loop.tid, len(loop.steps), loop.how))


def _numbers(numbers: Sequence[int]) -> str:
    """[0, 1, 2, 5] → `0-2, 5`."""
    runs: List[List[int]] = []
    for n in numbers:
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in runs)


def waits_text(ctx: Context) -> str:
    """Per stream: the windows of work proven done, the bounds on how long the work was
    outstanding, the certain idle gaps; then the sync sites."""
    rows = []
    keys = {w.stream for w in ctx.waits.windows} | {g.stream for g in ctx.waits.gaps} | set(
        ctx.waits.not_ready)
    for key in sorted(keys):
        windows = [w for w in ctx.waits.windows if w.stream == key]
        gaps = [g for g in ctx.waits.gaps if g.stream == key]
        low = sum(w.outstanding_bounds()[0] for w in windows)
        high = sum(w.outstanding_bounds()[1] for w in windows)
        rows.append(("%d" % key[0], "0x%x" % key[1] if key[1] else "0 (legacy)",
                     integer(len(windows)), integer(sum(w.blocked for w in windows)),
                     integer(low), integer(high), integer(len(gaps)),
                     integer(sum(g.ns for g in gaps)),
                     integer(ctx.waits.not_ready.get(key, 0))))
    text = " Where the host waits on the GPU (host-derived bounds, no GPU timestamps):"
    if not rows:
        return text + " no call proved a stream's work done"
    text += "\n\n" + table(("pid", "stream", "waits", "blocked", "outstanding >= (ns)",
                            "outstanding <= (ns)", "idle gaps", "idle >= (ns)",
                            "queries: busy"), rows)
    sites = ctx.waits.sync_sites(ctx.calls)
    if sites:
        text += "\n\n" + table(("calls", "blocked", "waited (ns)", "synchronising call site"),
                               [(integer(n), integer(b), integer(ns), site)
                                for site, n, b, ns in sites[:10]], left=(3,))
    return text + ("\n\n outstanding: from the first work queued after the stream was last "
                   "known done to the return of the call that waited for it (at least to "
                   "its start when it blocked);\n idle >= : from a proof of completion to the "
                   "next work queued on the stream (the stream may have gone idle earlier);"
                   "\n queries: busy: cudaStreamQuery/cudaEventQuery calls that found its "
                   "work not done.")


def replays_by_capture(ctx: Context) -> Dict[str, int]:
    """Graph launches that ran, by the site of their graph's capture (its begin's Python
    line, else its native caller)."""
    counts: Dict[str, int] = {}
    for call in ctx.calls:
        if call.role == "graph-launch" and call.is_work:
            site = ctx.captures.get((call.pid, call.args.get("graphExec")),
                                    "(capture not in the trace)")
            counts[site] = counts.get(site, 0) + 1
    return counts


def graphs_text(ctx: Context) -> str:
    """Graph replays by the site of the capture they were made from."""
    counts = replays_by_capture(ctx)
    if not counts:
        return ""
    return " CUDA graph replays by where their capture began:\n\n" + table(
        ("replays", "captured at"), [(integer(n), site) for site, n in sorted(counts.items())],
        left=(1,))


def elapsed_text(ctx: Context) -> str:
    """cudaEventElapsedTime results (GPU-measured), by call site."""
    sites: Dict[str, List[float]] = {}
    for call in ctx.waits.elapsed:
        if isinstance(call.outs.get("ms"), (int, float)):
            sites.setdefault(call.site, []).append(float(call.outs["ms"]))
    if not sites:
        return ""
    rows = [(integer(len(v)), "%.3f" % percentile(sorted(v), 50), "%.3f" % min(v),
             "%.3f" % max(v), site) for site, v in sorted(sites.items())]
    return " GPU-measured intervals (cudaEventElapsedTime, as the program computed them):\n\n" \
        + table(("calls", "median (ms)", "min (ms)", "max (ms)", "call site"), rows, left=(4,))
