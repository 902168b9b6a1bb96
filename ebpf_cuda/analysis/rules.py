"""The rules of `ebpf-cuda analyze`: one row of `RULES` and one function each. A function
takes the `Context` and returns its findings (none for a healthy program: a finding is a
claim that something should change). Thresholds are thresholds.py's; docs/analysis.md
says what each rule looks for and why."""
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..spec.apis import Direction, Role
from .findings import (HIGH, LOW, MEDIUM, Context, Finding, median, merge_threads, region,
                       thread_of)
from .steps import Loop, Step, loop_lines, native_region
from .thresholds import (CHURN_MIN_CALLS, LAUNCH_BOUND_MAX_BLOCKED, LAUNCH_BOUND_MIN_LAUNCHES,
                         LAUNCH_BOUND_MIN_SHARE, LAUNCH_MAX_CALL_NS, PAGEABLE_MIN_BYTES,
                         STEADY_SHARE, SYNC_MIN_BLOCKED_NS, SYNC_MIN_STEP_SHARE)
from .timeline import LEGACY_STREAM, PER_THREAD_STREAM, Call

# Errors that report a state, not a failure: a query's not-ready, peer access already on,
# memory already registered (each call site that gets one goes on by design).
EXPECTED_ERRORS = frozenset((600, 704, 712))
# Functions whose failure is the program checking for errors, not doing work.
ERROR_CHECKS = frozenset(("cudaGetLastError", "cudaPeekAtLastError"))


def _mostly(steps: Sequence[Step], has) -> List[Step]:
    """The steps for which `has(step)` holds, when they are at least STEADY_SHARE of
    `steps` (else none: a one-off is no pattern)."""
    hit = [s for s in steps if has(s)]
    return hit if steps and len(hit) >= STEADY_SHARE * len(steps) else []


def _share(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole else 0.0


def sync_in_step(ctx: Context) -> List[Finding]:
    """A call that waits for the GPU, made from the same place in most steady steps."""
    findings = []
    for loop in ctx.loops:
        steady = loop.steady()
        sites = sorted({c.site for s in steady for c in s.calls if c.blocking})
        for site in sites:
            def waits(step: Step, site=site) -> List[Call]:
                return [c for c in step.calls if c.blocking and c.site == site]
            hit = _mostly(steady, lambda s: any(c.duration_ns >= SYNC_MIN_BLOCKED_NS
                                                for c in waits(s)))
            calls = [c for s in hit for c in waits(s)]
            waited = sum(c.duration_ns for c in calls)
            wall = sum(s.wall_ns for s in hit)
            if not hit or _share(waited, wall) < SYNC_MIN_STEP_SHARE:
                continue
            mine = set(calls)
            idle = sum(g.ns for g in ctx.waits.gaps if g.after in mine)
            evidence = {"steps": len(hit), "steady_steps": len(steady), "calls": len(calls),
                        "waited_ns": waited, "waited_ns_per_step": waited // len(hit),
                        "share_of_step": _share(waited, wall),
                        "idle_after_ns": idle}
            findings.append(Finding(
                "sync-in-step", HIGH, "the host waits for the GPU inside every step",
                evidence, {"python": calls[0].python, "native": calls[0].native_site,
                           "in_loop": loop_lines(loop, calls), "api": calls[0].api,
                           "stream": calls[0].stream, "thread": thread_of(loop)},
                "keep the value on the GPU or read it once every N steps or after the loop "
                "(.item(), .cpu(), .tolist(), nonzero() and printing a tensor synchronise)",
                "%d calls in %d of %d steady steps waited %d ns (%d ns a step, %.1f%% of the "
                "step time)%s" % (len(calls), len(hit), len(steady), waited, waited // len(hit),
                                  100 * _share(waited, wall),
                                  "; the stream then stayed idle >= %d ns until the host "
                                  "queued more" % idle if idle else "")))
    return findings


def _pinned_ranges(calls: Sequence[Call]):
    """For each call index in time order, a function telling whether an address is in
    memory the CUDA driver knows (page-locked or managed) at that time."""
    live: Dict[Tuple[int, int], int] = {}  # (pid, start) → size
    for call in calls:
        yield call, live
        if call.failed:
            continue
        if call.role == Role.ALLOC and call.outs.get("ptr"):
            live[(call.pid, call.outs["ptr"])] = call.bytes
        elif call.role == Role.HOST_REGISTER and isinstance(call.args.get("ptr"), int):
            live[(call.pid, call.args["ptr"])] = call.bytes
        elif call.role in (Role.FREE, Role.HOST_UNREGISTER):
            live.pop((call.pid, call.args.get("ptr")), None)


def _host_pointer(call: Call) -> Optional[int]:
    side = {Direction.HTOD: "src", Direction.DTOH: "dst"}.get(call.direction or "")
    value = call.args.get(side) if side else None
    return value if isinstance(value, int) else None


def _is_pinned(live: Dict[Tuple[int, int], int], pid: int, address: int) -> bool:
    return any(p == pid and start <= address < start + size
               for (p, start), size in live.items())


def _synced_at_once(ctx: Context, call: Call) -> bool:
    """An async copy whose thread's next call waits for the GPU (PyTorch's blocking copies:
    cudaMemcpyAsync then cudaStreamSynchronize): synchronous in effect."""
    calls = ctx.timeline.threads.get((call.pid, call.tid), [])
    following = calls[call.index + 1] if call.index + 1 < len(calls) else None
    return following is not None and following.blocking and following.role is None


def pageable_copy(ctx: Context) -> List[Finding]:
    """Copies of at least PAGEABLE_MIN_BYTES between the GPU and host memory no CUDA call
    allocated page-locked or registered: async ones anywhere, synchronous ones when in most
    steady steps."""
    in_steps = {id(c): loop for loop in ctx.loops for s in loop.steady() for c in s.calls}
    groups: Dict[Tuple[str, str, bool], List[Call]] = {}
    for call, live in _pinned_ranges(ctx.calls):
        if call.role != Role.COPY or call.failed or call.bytes < PAGEABLE_MIN_BYTES:
            continue
        host = _host_pointer(call)
        if host is None or _is_pinned(live, call.pid, host):
            continue
        asynchronous = call.asynchronous and not _synced_at_once(ctx, call)
        if asynchronous or id(call) in in_steps:
            groups.setdefault((call.site, call.direction or "", asynchronous),
                              []).append(call)
    findings = []
    for (site, direction, asynchronous), calls in sorted(groups.items()):
        if not asynchronous:
            loop = in_steps[id(calls[0])]
            mine = set(calls)
            if not _mostly(loop.steady(), lambda s: any(c in mine for c in s.calls)):
                continue
        moved = sum(c.bytes for c in calls)
        took = sum(c.duration_ns for c in calls)
        findings.append(Finding(
            "pageable-copy", HIGH if asynchronous else MEDIUM,
            "%s copies from pageable host memory" % ("async" if asynchronous else "synchronous"),
            {"calls": len(calls), "bytes": moved, "call_ns": took, "asynchronous": asynchronous},
            {"python": calls[0].python, "native": calls[0].native_site, "api": calls[0].api,
             "direction": direction, "stream": calls[0].stream,
             "thread": "%d/%d" % (calls[0].pid, calls[0].tid)},
            "allocate the host buffer page-locked (cudaHostAlloc, tensor.pin_memory(), "
            "pin_memory=True in the DataLoader) or register it (cudaHostRegister)%s" % (
                ": an async copy of pageable memory is staged and blocks the host"
                if asynchronous else ""),
            "%d %s copies of %d bytes from host memory not page-locked took %d ns in the calls"
            % (len(calls), direction, moved, took)))
    return findings


def alloc_churn(ctx: Context) -> List[Finding]:
    """Synchronous allocations and frees in most steady steps."""
    findings = []
    for loop in ctx.loops:
        steady = loop.steady()

        def churn(step: Step) -> List[Call]:
            return [c for c in step.calls if c.role in (Role.ALLOC, Role.FREE)
                    and not c.failed and not c.asynchronous]
        hit = _mostly(steady, lambda s: len(churn(s)) >= CHURN_MIN_CALLS)
        if not hit:
            continue
        calls = [c for s in hit for c in churn(s)]
        allocs = [c for c in calls if c.role == Role.ALLOC]
        took = sum(c.duration_ns for c in calls)
        wall = sum(s.wall_ns for s in hit)
        evidence = {"steps": len(hit), "steady_steps": len(steady),
                    "allocations": len(allocs), "frees": len(calls) - len(allocs),
                    "bytes_allocated": sum(c.bytes for c in allocs), "call_ns": took,
                    "call_ns_per_step": took // len(hit), "share_of_step": _share(took, wall)}
        findings.append(Finding(
            "alloc-churn", MEDIUM, "memory is allocated and freed in steady-state steps",
            evidence, {"python": loop_lines(loop, calls) or region(calls),
                       "sites": sorted({c.site for c in calls if c.python or c.native_site})[:8],
                       "api": sorted({c.api for c in calls}),
                       "thread": thread_of(loop)},
            "allocate once before the loop and reuse the buffers (in PyTorch: no "
            "torch.cuda.empty_cache() in the loop; keep shapes stable for the caching "
            "allocator)",
            "%d allocations and %d frees (%d bytes allocated) in %d of %d steady steps; "
            "%d ns in those calls, %.1f%% of the step time"
            % (len(allocs), len(calls) - len(allocs), evidence["bytes_allocated"], len(hit),
               len(steady), took, 100 * evidence["share_of_step"])))
    return findings


def _sequence(steps: Sequence[Step]) -> List[str]:
    """The launch sequence of a step, runs of one kernel collapsed (`name x4`)."""
    out: List[List[Any]] = []
    for call in steps[len(steps) // 2].launches:
        if out and out[-1][0] == call.kernel:
            out[-1][1] += 1
        else:
            out.append([call.kernel, 1])
    return [name if n == 1 else "%s x%d" % (name, n) for name, n in out]


def launch_bound(ctx: Context) -> List[Finding]:
    """Eager steps with many launches, whose launch sequence spans a large share of the step,
    while the GPU is shown to keep up: the thread waits little for it, in the steps and in
    the synchronising calls after them (without such a call nothing shows the GPU kept up:
    no finding), and the launch calls themselves do not wait (a full launch queue)."""
    findings = []
    for loop in ctx.loops:
        steady = [s for s in loop.steady() if s.mode == "eager"]
        if not steady or len(steady) < STEADY_SHARE * len(loop.steady()):
            continue
        after = _waits_after(ctx, loop)
        if after is None:
            continue
        launches = median([len(s.launches) for s in steady])
        span = median([_launch_span(s) for s in steady])
        wall = median([s.wall_ns for s in steady])
        blocked = sum(s.blocked_ns for s in steady) + after
        call = median([c.duration_ns for s in steady for c in s.launches])
        if launches < LAUNCH_BOUND_MIN_LAUNCHES or _share(span, wall) < LAUNCH_BOUND_MIN_SHARE \
                or _share(blocked, sum(s.wall_ns for s in steady)) > LAUNCH_BOUND_MAX_BLOCKED \
                or call > LAUNCH_MAX_CALL_NS:
            continue
        findings.append(_graphs_would_save(ctx, loop, steady, launches, span, wall))
    return findings


def _waits_after(ctx: Context, loop: Loop) -> Optional[int]:
    """ns the loop's thread waited in blocking calls after its last step; None when it made
    none (nothing then shows whether the GPU had kept up)."""
    last = loop.steps[-1].calls[-1].index
    calls = ctx.timeline.threads.get((loop.pid, loop.tid), [])
    waits = [c.duration_ns for c in calls[last + 1:] if c.blocking and not c.failed]
    return sum(waits) if waits else None


def _launch_span(step: Step) -> int:
    """Host time from the step's first launch call's start to its last one's end."""
    launches = step.launches
    return launches[-1].end_ns - launches[0].start_ns if launches else 0


def graph_saving(ctx: Context, steps: Sequence[Step]) -> Tuple[int, int, int, bool]:
    """What CUDA graphs would save a step of `steps` (their eager launches made one graph
    launch): (median launch ns a step, one graph launch's ns, the saving, whether that graph
    launch's cost was measured in this trace: else it is one kernel launch's)."""
    graph_calls = [c for c in ctx.calls if c.role == Role.GRAPH_LAUNCH and c.is_work]
    launches = [c for s in steps for c in s.launches]
    if not launches:
        return 0, 0, 0, bool(graph_calls)
    launch_ns = median([sum(c.duration_ns for c in s.launches) for s in steps])
    one = median([c.duration_ns for c in (graph_calls or launches)])
    return int(launch_ns), int(one), max(0, int(launch_ns - one)), bool(graph_calls)


def _graphs_would_save(ctx: Context, loop: Loop, steady: Sequence[Step], launches: float,
                       span: float, wall: float) -> Finding:
    launch_ns, one, save, measured = graph_saving(ctx, steady)
    most = max(0, int(span - one))  # the host time that issues the sequence, replaced
    calls = [c for s in steady for c in s.launches]
    grids = [_threads(c.args.get("grid")) for c in calls]
    evidence = {"steps": len(steady), "launches_per_step": int(launches),
                "launch_ns_per_step": int(launch_ns), "launch_span_ns_per_step": int(span),
                "step_ns": int(wall), "share_of_step": _share(span, wall),
                "median_grid_blocks": int(median([g for g in grids if g])) if any(grids) else None,
                "graphs_would_save_ns_per_step": save,
                "graphs_would_save_at_most_ns_per_step": most,
                "graph_launch_ns": int(one), "graph_launch_measured": measured}
    return Finding(
        "launch-bound", MEDIUM, "steps are launch-bound: CUDA graphs would save host time",
        evidence, {**regions(loop, calls, steady), "kernels": _sequence(steady),
                   "stream": sorted({c.stream for c in calls}), "thread": thread_of(loop)},
        "capture the step's launches once as a CUDA graph and replay it "
        "(torch.cuda.CUDAGraph / torch.compile(mode=\"reduce-overhead\"), or "
        "cudaStreamBeginCapture ... cudaGraphLaunch)",
        "%d launches a step, issued over %d ns of a %d ns step (%.1f%%), %d ns of it in the "
        "launch calls, while the GPU kept up; one graph launch instead (%d ns%s) would save "
        "at least ~%d ns a step (the launch calls) and at most ~%d ns (the host time issuing "
        "them)" % (launches, span, wall, 100 * _share(span, wall), launch_ns, one,
                   ", measured" if measured else ", as one kernel launch", save, most))


def regions(loop: Loop, calls: Sequence[Call], steps: Sequence[Step]) -> Dict[str, Any]:
    """A finding's `python` (the loop's lines that made `calls`, else their innermost
    shared user frame) and, without one, its `native` (--stacks: the innermost native
    function the stacked calls of `steps` share; launches record no stack)."""
    python = loop_lines(loop, calls) or region(calls)
    return {"python": python, "native": None if python else native_region(
        [c for s in steps for c in s.calls])}


def _threads(grid: Any) -> int:
    if isinstance(grid, (tuple, list)) and len(grid) == 3:
        return int(grid[0]) * int(grid[1]) * int(grid[2])
    return 0


def graph_fallback(ctx: Context) -> List[Finding]:
    """A loop whose steps replay CUDA graphs, some of which, after the first replay, ran
    eagerly (the eager steps before it are the warm-up and capture: torch.compile's)."""
    findings = []
    for loop in ctx.loops:
        steady = loop.steady()
        graph = [s for s in steady if s.mode == "graph"]
        eager = [s for s in steady if s.mode in ("eager", "mixed")
                 and graph and s.number > graph[0].number]
        if not graph or not eager:
            continue
        sites = sorted({ctx.captures.get((c.pid, c.args.get("graphExec")), "?")
                        for s in graph for c in s.graph_launches})
        findings.append(Finding(
            "graph-fallback", MEDIUM, "some steps ran eagerly instead of replaying the graph",
            {"steps": len(steady), "graph_steps": len(graph), "eager_steps": len(eager),
             "fallback_steps": [s.number for s in eager],
             "launches_in_fallback": sum(len(s.launches) for s in eager)},
            {**regions(loop, [c for s in eager for c in s.launches], eager),
             "captured_at": sites, "thread": thread_of(loop)},
            "make the fallback steps' inputs match the capture (same shapes, dtypes and "
            "static buffers) so every step replays the graph",
            "%d of %d steady steps replayed a graph, %d ran eagerly: steps %s"
            % (len(graph), len(steady), len(eager), ", ".join(str(s.number) for s in eager))))
    return findings


# Stream creations whose new stream the legacy default stream serialises with: created
# without cudaStreamNonBlocking (flags 0; cudaStreamCreate has none).
BLOCKING_STREAM_CREATES = ("cudaStreamCreate", "cudaStreamCreateWithFlags",
                           "cudaStreamCreateWithPriority", "cuStreamCreate",
                           "cuStreamCreateWithPriority")


def _blocking_streams(calls: Sequence[Call]) -> set:
    """(pid, stream) of the streams seen created blocking (streams created before the trace
    or non-blocking are not: nothing is claimed about them)."""
    return {(c.pid, c.outs.get("stream")) for c in calls
            if c.api in BLOCKING_STREAM_CREATES and not c.failed
            and not (c.args.get("flags") or c.args.get("Flags") or 0) & 1}


def default_stream_work(ctx: Context) -> List[Finding]:
    """Memsets and device-to-device copies on the legacy default stream of a process that
    also queues work on streams created blocking (the legacy stream serialises with them)."""
    blocking = _blocking_streams(ctx.calls)
    others = {c.pid for c in ctx.calls if c.is_work and c.stream not in (
        None, LEGACY_STREAM, PER_THREAD_STREAM) and (c.pid, c.stream) in blocking}
    groups: Dict[Tuple[int, str, str], List[Call]] = {}
    for call in ctx.calls:
        if call.pid in others and call.is_work and call.stream == LEGACY_STREAM and (
                call.role == Role.MEMSET or call.direction == Direction.DTOD):
            groups.setdefault((call.pid, call.site, call.api), []).append(call)
    return [Finding(
        "default-stream-work", LOW, "memsets/device-to-device copies on the legacy default "
        "stream", {"calls": len(calls), "bytes": sum(c.bytes for c in calls)},
        {"python": calls[0].python, "native": calls[0].native_site, "api": api,
         "stream": LEGACY_STREAM,
         "thread": "%d/%d" % (calls[0].pid, calls[0].tid)},
        "issue them on the stream whose work they belong to (cudaMemsetAsync/"
        "cudaMemcpyAsync with that stream): the legacy stream waits for every other stream",
        "%d calls (%d bytes) on the legacy default stream while the process uses blocking "
        "streams" % (len(calls), sum(c.bytes for c in calls)))
        for (pid, site, api), calls in sorted(groups.items())]


def ignored_error(ctx: Context) -> List[Finding]:
    """A failed call after which the thread queued more work on the same stream without
    asking for the error."""
    groups: Dict[Tuple[str, str, Optional[str]], List[Tuple[Call, Call]]] = {}
    for calls in ctx.timeline.threads.values():
        for i, call in enumerate(calls):
            if not call.failed or call.ret in EXPECTED_ERRORS or call.api in ERROR_CHECKS:
                continue
            after = _next_work(calls[i + 1:], call)
            if after is not None:
                groups.setdefault((call.site, call.api, call.ret_name), []).append((call, after))
    return [Finding(
        "ignored-error", HIGH, "a call failed and the program went on as if it had not",
        {"calls": len(pairs), "error": name, "ret": pairs[0][0].ret},
        {"python": pairs[0][0].python, "native": pairs[0][0].native_site, "api": api,
         "stream": pairs[0][0].stream, "then": pairs[0][1].site,
         "thread": "%d/%d" % (pairs[0][0].pid, pairs[0][0].tid)},
        "check the result of %s (or cudaGetLastError after it) and stop or recover" % api,
        "%d calls of %s returned %s and more work followed on the stream (first: %s)"
        % (len(pairs), api, name, pairs[0][1].api))
        for (site, api, name), pairs in sorted(groups.items(), key=lambda g: str(g[0]))]


def _next_work(calls: Sequence[Call], failed: Call) -> Optional[Call]:
    """The work queued after a failed call on its stream (on any, for calls that name
    none), unless the program asked for the error or made the same call again first and
    it worked (a retry: PyTorch's allocator after an out-of-memory error)."""
    for call in calls:
        if call.api in ERROR_CHECKS or (call.api == failed.api and not call.failed):
            return None
        if call.is_work and (failed.stream is None or call.stream == failed.stream):
            return call
    return None


class Rule(NamedTuple):
    id: str
    severity: str
    check: Callable[[Context], List[Finding]]
    summed: Tuple[str, ...] = ()  # evidence that adds up when threads' findings merge


RULES: Tuple[Rule, ...] = (
    Rule("sync-in-step", HIGH, sync_in_step, ("calls", "waited_ns", "idle_after_ns")),
    Rule("pageable-copy", HIGH, pageable_copy, ("calls", "bytes", "call_ns")),
    Rule("alloc-churn", MEDIUM, alloc_churn, ("allocations", "frees", "bytes_allocated",
                                              "call_ns", "call_ns_per_step")),
    Rule("launch-bound", MEDIUM, launch_bound),
    Rule("graph-fallback", MEDIUM, graph_fallback, ("launches_in_fallback",)),
    Rule("default-stream-work", LOW, default_stream_work, ("calls", "bytes")),
    Rule("ignored-error", HIGH, ignored_error, ("calls",)),
)


def run_rules(ctx: Context) -> List[Finding]:
    """Every rule's findings, in the table's order; one per rule and site when threads of
    a process found the same (merge_threads)."""
    return [finding for rule in RULES for finding in merge_threads(rule.check(ctx),
                                                                   rule.summed)]
