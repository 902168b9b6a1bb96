"""analysis/ of `ebpf-cuda analyze` without probes: steps, wait bounds and rules on event
lists made by hand (times exact), and the thresholds table against docs/analysis.md."""
from pathlib import Path
from typing import List, Optional

from ebpf_cuda.analysis import thresholds
from ebpf_cuda.analysis.analyzer import Analyzer, unmatched
from ebpf_cuda.analysis.steps import names, native_region
from ebpf_cuda.decode.events import EXIT, Event, PyFrame
from ebpf_cuda.targets.symbols import Frame

DOCS = Path(__file__).resolve().parent.parent / "docs" / "analysis.md"
US = 1000


class Script:
    """Calls of one thread made back to back: each `call` starts where the last ended plus
    `gap` ns and lasts `took` ns."""

    def __init__(self, pid: int = 7, tid: int = 7) -> None:
        self.now = 1_000_000
        self.events: List[Event] = []
        self.pid, self.tid = pid, tid

    def call(self, api: str, took: int = 2 * US, gap: int = 1 * US, ret: int = 0,
             line: Optional[int] = None, outs=None, **args) -> Event:
        self.now += gap
        start = self.now
        self.now += took
        stack = None if line is None else (PyFrame("/app/train.py", line, "train"),
                                           PyFrame("/app/train.py", 90, "<module>"))
        event = Event(self.now / 1e9, self.now, self.pid, self.tid, "app", api, EXIT, args,
                      ret=ret, ret_name="e%d" % ret if ret else "cudaSuccess",
                      duration_ns=took, outs=dict(outs or {}), py_stack=stack)
        assert event.ts_ns - event.duration_ns == start
        self.events.append(event)
        return event

    def launch(self, func: int = 0x100, line: Optional[int] = None, stream: int = 0,
               took: int = 5 * US, **kw) -> Event:
        return self.call("cudaLaunchKernel", took=took, line=line, func=func,
                         grid=(1, 1, 1), block=(32, 1, 1), stream=stream, **kw)


def analyzed(script: Script, step_at: Optional[str] = None) -> Analyzer:
    analyzer = Analyzer(step_at=step_at)
    analyzer.write(script.events)
    return analyzer


def rules(analyzer: Analyzer) -> List[str]:
    return [f.rule for f in analyzer.findings()]


def healthy(steps: int = 6) -> Script:
    s = Script()
    s.call("cudaMalloc", size=1 << 20, outs={"ptr": 0x7f0000000000})
    for _ in range(steps):
        s.call("cudaMemcpyAsync", dst=0x7f0000000000, src=0x7e0000000000, size=4096,
               kind="HostToDevice", stream=0x5000)
        for func in (0x100, 0x200, 0x100):
            s.launch(func, stream=0x5000)
        s.now += 50 * US  # the host's own work
    s.call("cudaStreamSynchronize", took=300 * US, stream=0x5000)
    return s


def test_a_healthy_loop_has_its_steps_and_no_finding():
    analyzer = analyzed(healthy(6))
    loops = analyzer.context().loops
    assert [len(loop.steps) for loop in loops] == [6]
    assert all(len(step.launches) == 3 and len(step.copies) == 1 for step in loops[0].steps)
    assert loops[0].steps[0].allocations  # the set-up allocation goes with the first step
    assert analyzer.findings() == []
    assert "Findings: 0" in analyzer.report()


def test_no_loop_no_steps():
    s = Script()
    for func in (0x100, 0x200, 0x300, 0x100, 0x200):
        s.launch(func)
    s.call("cudaDeviceSynchronize")
    analyzer = analyzed(s)
    assert analyzer.context().loops == []
    assert "Steps: none found" in analyzer.report()


def test_steps_equal_iterations_with_a_nested_loop_and_an_epilogue():
    s = Script()
    for _ in range(5):
        s.launch(0x900)
        for _ in range(4):
            s.launch(0x100)
        s.call("cudaMemcpy", dst=0x1000, src=0x7f0000000000, size=4, kind="DeviceToHost")
    s.call("cudaFree", ptr=0x7f0000000000)
    loop, = analyzed(s).context().loops
    assert len(loop.steps) == 5
    assert [len(st.launches) for st in loop.steps] == [5] * 5
    assert loop.steps[-1].calls[-1].api == "cudaMemcpy"  # the free after the loop is no step


def test_step_at_a_cuda_function_and_a_python_function():
    s = Script()
    for _ in range(4):
        s.launch(0x100, line=11)
        s.launch(0x200, line=12)
    assert len(analyzed(s, step_at="cudaLaunchKernel").context().loops[0].steps) == 8
    assert len(analyzed(s, step_at="train").context().loops[0].steps) == 4


def test_step_at_matching_nothing_says_so_in_one_line():
    s = Script()
    for _ in range(4):
        s.launch(0x100, line=11)
    analyzer = analyzed(s, step_at="evaluate")
    assert analyzer.context().loops == []
    reason = unmatched("evaluate")
    assert reason.startswith("--step-at evaluate matched nothing: ") and "\n" not in reason
    assert " Steps: none: " + reason + "\n" in analyzer.report()
    assert [r for r in analyzer.records() if r["type"] == "no_steps"] == [
        {"type": "no_steps", "step_at": "evaluate", "reason": reason}]


TRAIN = "Model::train_step(float*, int) const"
NATIVE = {  # stack_id → the user stack of a call, innermost first (as --stacks names them)
    1: (Frame("cudaMemcpy", 0x40, "/usr/lib/libcudart.so.12"), Frame(TRAIN, 0x10, "/app/train"),
        Frame("main", 0x80, "/app/train")),
    2: (Frame("cudaStreamSynchronize", 0x20, "/usr/lib/libcudart.so.12"), None,
        Frame(TRAIN, 0x30, "/app/train"), Frame("main", 0x80, "/app/train")),
    3: (Frame("setup", 0x8, "/app/train"), Frame("main", 0x40, "/app/train")),
    4: (Frame("main", 0x90, "/app/train"),),
}


def native_loop(step_at: Optional[str]) -> Analyzer:
    """Set-up, 4 invocations of TRAIN (a copy, two launches, a sync; a free from main
    between the second and the third), a sync after them."""
    s = Script()

    def stacked(api: str, stack: int, **args) -> None:
        s.call(api, **args).stack_id = stack

    stacked("cudaMemcpy", 3, dst=0x7f0000000000, src=0x7e0000000000, size=4096,
            kind="HostToDevice")
    for step in range(4):
        stacked("cudaMemcpy", 1, dst=0x7f0000000000, src=0x7e0000000000, size=4096,
                kind="HostToDevice")
        s.launch(0x100, stream=0x5000)
        s.launch(0x200, stream=0x5000)
        stacked("cudaStreamSynchronize", 2, stream=0x5000)
        if step == 1:
            stacked("cudaFree", 4, ptr=0x7d0000000000)
    stacked("cudaStreamSynchronize", 4, stream=0x5000)
    analyzer = Analyzer(step_at=step_at, stacks=lambda pid, stack: NATIVE[stack])
    analyzer.write(s.events)
    return analyzer


def test_step_at_a_native_function_starts_each_invocation():
    """--stacks: a step starts at the first stacked call with a frame of the function after
    calls without one, or whose return offset in it is before the previous call's; the
    launches (no stack) fall in the step they are in; the last step ends after the tokens
    most steps have (the sync after the loop is no step's)."""
    for name in ("train_step", "Model::train_step", TRAIN):
        loop, = native_loop(name).context().loops
        assert [len(step.launches) for step in loop.steps] == [2] * 4, name
        assert [step.tokens[0][0] for step in loop.steps] == ["copy"] * 4
        assert loop.steps[2].calls[0].api == "cudaFree"  # (what no token: the next step's)
        assert loop.steps[-1].calls[-1].native == "%s+0x30 (train)" % TRAIN
        # the loop's region: the innermost function its steady steps' stacked calls share
        # (main: step 2 frees from there), and step 3's: the function's calls' offsets
        assert loop.where == "main+0x80-0x90 (train)"
        assert native_region(loop.steps[3].calls) == "%s+0x10-0x30 (train)" % TRAIN
    assert len(native_loop(None).context().loops[0].steps) == 4  # (found alike)
    for name in ("step", "Model", "train_step(int)", "cudaMemcpy+0x40"):
        assert native_loop(name).context().loops == [], name
    assert names("ns::f(std::function<void (int)>)", "f")
    assert names("(anonymous namespace)::f(int)", "f") and not names("g(f)", "f")


def test_sync_in_step_names_the_line_with_its_waits():
    s = Script()
    for _ in range(5):
        s.launch(0x100, line=20)
        s.call("cudaStreamSynchronize", took=400 * US, line=21, stream=0)
        s.now += 200 * US
    finding, = analyzed(s).findings()
    assert finding.rule == "sync-in-step"
    assert finding.where["python"] == "/app/train.py:21 train"
    assert finding.evidence["calls"] == 4 and finding.evidence["steps"] == 4
    assert finding.evidence["waited_ns"] == 4 * 400 * US
    assert finding.evidence["idle_after_ns"] == 3 * (200 * US + 1 * US)  # to the next launch


def test_wait_bounds_bracket_the_device_time():
    s = Script()
    s.launch(0x100, stream=0x5000)  # starts at t0
    t0 = s.events[-1].ts_ns - s.events[-1].duration_ns
    s.launch(0x100, stream=0x5000)
    sync = s.call("cudaStreamSynchronize", took=900 * US, stream=0x5000)
    window, = analyzed(s).context().waits.windows
    low, high = window.outstanding_bounds()
    assert low == sync.ts_ns - sync.duration_ns - t0 and high == sync.ts_ns - t0
    assert window.blocked


def test_pageable_async_copy_but_not_a_pinned_one():
    s = Script()
    s.call("cudaHostAlloc", size=1 << 20, flags=0, outs={"ptr": 0x7e0000000000})
    s.call("cudaMemcpyAsync", dst=0x7f0000000000, src=0x7e0000000000 + 4096, size=1 << 19,
           kind="HostToDevice", stream=0x5000, line=30)
    s.call("cudaMemcpyAsync", dst=0x7f0000000000, src=0x55550000, size=1 << 19,
           kind="HostToDevice", stream=0x5000, line=31)
    s.call("cudaMemcpyAsync", dst=0x55550000, src=0x7f0000000000, size=4,
           kind="DeviceToHost", stream=0x5000, line=32)  # small: no finding
    finding, = analyzed(s).findings()
    assert (finding.rule, finding.where["python"]) == ("pageable-copy", "/app/train.py:31 train")
    assert finding.evidence["bytes"] == 1 << 19 and finding.evidence["calls"] == 1


def test_alloc_churn_launch_bound_and_errors():
    s = Script()
    for _ in range(4):
        s.call("cudaMalloc", size=4096, line=40, outs={"ptr": 0x7f0000000000})
        for k in range(25):
            s.launch(0x100 + k, line=41, took=4 * US, gap=0)
        s.call("cudaFree", ptr=0x7f0000000000, line=42)
    assert [f.rule for f in analyzed(s).findings()] == ["alloc-churn"]  # nothing shows the
    s.call("cudaDeviceSynchronize", took=5 * US, line=43)  # GPU kept up; now this does
    found = analyzed(s).findings()
    assert [f.rule for f in found] == ["alloc-churn", "launch-bound"]
    churn, bound = found
    assert churn.evidence["allocations"] == 3 and churn.evidence["frees"] == 3
    assert bound.evidence["launches_per_step"] == 25
    assert bound.evidence["launch_ns_per_step"] == 100 * US
    assert bound.evidence["graphs_would_save_ns_per_step"] == 96 * US
    assert bound.evidence["graphs_would_save_at_most_ns_per_step"] == 96 * US  # back to back
    assert bound.where["python"] == "/app/train.py:41 in train"
    s.call("cudaDeviceSynchronize", took=3000 * US, line=43)  # the GPU was far behind
    assert [f.rule for f in analyzed(s).findings()] == ["alloc-churn"]

    s = Script()
    s.call("cudaMemcpyAsync", ret=1, dst=0, src=0, size=4, kind="HostToDevice", stream=0x5000)
    s.launch(0x100, stream=0x5000)
    finding, = analyzed(s).findings()
    assert finding.rule == "ignored-error" and finding.where["api"] == "cudaMemcpyAsync"


def test_graph_replays_their_capture_and_fallback_steps():
    s = Script()
    s.call("cudaStreamBeginCapture", stream=0x5000, mode=0, line=50)
    s.launch(0x100, stream=0x5000, outs={"captured": True})
    s.call("cudaStreamEndCapture", stream=0x5000, outs={"graph": 0x6000})
    s.call("cudaGraphInstantiate", graph=0x6000, flags=0, outs={"graphExec": 0x7000})
    for i in range(6):
        s.call("cudaMemcpyAsync", dst=0x7f0000000000, src=0x7e0000000000, size=16,
               kind="HostToDevice", stream=0x5000, line=55)
        if i == 3:
            s.launch(0x100, stream=0x5000, line=57)
        else:
            s.call("cudaGraphLaunch", graphExec=0x7000, stream=0x5000, line=56)
    analyzer = analyzed(s)
    loop, = analyzer.context().loops
    assert [st.mode for st in loop.steps] == ["graph"] * 3 + ["eager"] + ["graph"] * 2
    finding, = analyzer.findings()
    assert finding.rule == "graph-fallback" and finding.evidence["fallback_steps"] == [3]
    assert finding.where["captured_at"] == ["/app/train.py:50 train"]
    assert "5  /app/train.py:50 train" in analyzer.report()


def test_graph_fallback_names_the_native_region_without_python_stacks():
    """--stacks, no Python stacks: the fallback's region is the innermost function its
    steps' stacked calls share (the launches record no stack); the capture's site its
    native caller."""
    frames = {1: (Frame("capture", 0x8, "/app/train"), Frame("main", 0x20, "/app/train")),
              2: (Frame("forward", 0x10, "/app/train"), Frame("main", 0x40, "/app/train")),
              3: (Frame("forward", 0x30, "/app/train"), Frame("main", 0x40, "/app/train"))}
    s = Script()
    s.call("cudaStreamBeginCapture", stream=0x5000, mode=0).stack_id = 1
    s.launch(0x100, stream=0x5000, outs={"captured": True})
    s.call("cudaStreamEndCapture", stream=0x5000, outs={"graph": 0x6000}).stack_id = 1
    s.call("cudaGraphInstantiate", graph=0x6000, flags=0, outs={"graphExec": 0x7000})
    for i in range(6):
        s.call("cudaMemcpyAsync", dst=0x7f0000000000, src=0x7e0000000000, size=16,
               kind="HostToDevice", stream=0x5000).stack_id = 2
        if i == 3:
            s.launch(0x100, stream=0x5000)
        else:
            s.call("cudaGraphLaunch", graphExec=0x7000, stream=0x5000).stack_id = 3
    s.call("cudaStreamSynchronize", stream=0x5000).stack_id = 1
    analyzer = Analyzer(stacks=lambda pid, stack: frames[stack])
    analyzer.write(s.events)
    loop, = analyzer.context().loops
    assert loop.where == "forward+0x10-0x30 (train)"
    finding, = analyzer.findings()
    assert finding.rule == "graph-fallback" and finding.evidence["fallback_steps"] == [3]
    assert finding.where["python"] is None
    assert finding.where["native"] == "forward+0x10 (train)"  # (the step's copy: stacked)
    assert finding.where["captured_at"] == ["capture+0x8 (train)"]


def test_thresholds_are_documented_with_their_values():
    text = DOCS.read_text()
    for row in thresholds.TABLE:
        line = next((ln for ln in text.splitlines() if ln.startswith("| `%s` |" % row.name)),
                    None)
        assert line is not None, row.name
        assert ("| %g |" % row.value) in line.replace("  ", " "), line


def test_the_html_report_shows_the_findings_and_steps():
    import io

    from ebpf_cuda.output.html_report import HtmlReport

    s = Script()
    for _ in range(5):
        s.launch(0x100, line=20)
        s.call("cudaStreamSynchronize", took=400 * US, line=21, stream=0)
    out = io.StringIO()
    out.close = lambda: None  # (kept open to be read)
    report = HtmlReport(out)
    report.analyzer = analyzed(s)
    report.write(s.events)
    report.close()
    page = out.getvalue()
    assert "sync-in-step" in page and "/app/train.py:21 train" in page
    assert "Steps of thread 7/7: 5" in page


def test_the_slow_tail_and_deviating_steps_are_named():
    s = Script()
    for i in range(8):
        s.launch(0x100)
        s.launch(0x200)
        if i == 5:
            s.call("cudaDeviceSynchronize", took=50 * US)
        s.now += 100 * US if i != 4 else 900 * US
    loop, = analyzed(s).context().loops
    assert len(loop.steps) == 8
    assert sorted(loop.deviating) == [4, 5]
    assert "the median step time" in loop.deviating[4]
    assert "+1 sync cudaDeviceSynchronize" in loop.deviating[5]


def test_the_gpu_checks_judges_pass_right_records_and_fail_wrong_ones():
    import subprocess
    import sys

    script = DOCS.parent.parent / "scripts" / "gpu" / "analyze_check.py"
    done = subprocess.run([sys.executable, str(script), "self-test"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.endswith("self-test ok\n"), done.stdout


def _graph_set_up(s: Script) -> None:
    s.call("cudaHostAlloc", size=1 << 22, flags=0, outs={"ptr": 0x7e0000000000})  # pinned
    for size in (1 << 18, 1 << 10) * 4:  # a model's weights and biases uploaded
        s.call("cudaMemcpyAsync", dst=0x7f0000000000, src=0x7e0000000000, size=size,
               kind="HostToDevice", stream=0)
    for _ in range(3):  # a warm-up loop: the step's kernels, no input copy
        for func in (0x100, 0x200, 0x300):
            s.launch(func)
    s.call("cudaStreamBeginCapture", stream=0x5000, mode=0)
    s.launch(0x100, stream=0x5000, outs={"captured": True})
    s.call("cudaStreamEndCapture", stream=0x5000, outs={"graph": 0x6000})
    s.call("cudaGraphInstantiate", graph=0x6000, flags=0, outs={"graphExec": 0x7000})


def _input(s: Script) -> None:
    s.call("cudaMemcpyAsync", dst=0x7f0000000000, src=0x7e0000000000, size=1 << 16,
           kind="HostToDevice", stream=0)


def test_steps_are_the_main_loops_after_set_up_and_warm_up():
    s = Script()
    _graph_set_up(s)
    for _ in range(10):
        _input(s)
        s.call("cudaGraphLaunch", graphExec=0x7000, stream=0)
    loop, = analyzed(s).context().loops
    assert len(loop.steps) == 10 and {st.mode for st in loop.steps} == {"graph"}


def test_steps_of_a_compiled_loop_count_its_eager_warm_up_iterations():
    s = Script()
    _graph_set_up(s)
    for i in range(10):  # as cudagraph trees: a warm-up step runs eagerly, then replays
        _input(s)
        if i == 0:
            for func in (0x100, 0x200, 0x300):
                s.launch(func)
        else:
            s.call("cudaGraphLaunch", graphExec=0x7000, stream=0)
    analyzer = analyzed(s)
    loop, = analyzer.context().loops
    assert [st.mode for st in loop.steps] == ["warm-up"] + ["graph"] * 9
    assert len(loop.steady()) == 9  # (the replays)
    assert "Mode of each step: warm-up: 0; graph: 1-9" in analyzer.report()
    assert analyzer.findings() == []  # an eager warm-up before the replays is no fallback


def test_an_outer_loop_over_identical_layers():
    s = Script()
    for _ in range(6):
        s.launch(0x50)  # the embedding
        for _ in range(12):  # twelve identical layers
            for func in (0x100, 0x200, 0x300):
                s.launch(func)
        s.launch(0x900)  # the optimizer
    loop, = analyzed(s).context().loops
    assert len(loop.steps) == 6 and all(len(st.launches) == 38 for st in loop.steps)


def test_queries_that_find_work_busy_raise_the_lower_bound():
    s = Script()
    first = s.launch(0x100, stream=0x5000)
    s.call("cudaEventRecord", event=0xe000, stream=0x5000)
    busy = s.call("cudaEventQuery", event=0xe000, ret=600)
    s.call("cudaStreamQuery", stream=0x5000, ret=600)
    done = s.call("cudaEventQuery", event=0xe000)
    waits = analyzed(s).context().waits
    assert waits.not_ready == {(7, 0x5000): 2}
    window, = waits.windows
    start = first.ts_ns - first.duration_ns
    later_busy = s.events[3]
    assert window.outstanding_bounds() == (
        later_busy.ts_ns - later_busy.duration_ns - start, done.ts_ns - start)
    assert busy.ret == 600


def test_default_stream_work_only_beside_other_streams():
    def program(other_stream: bool, flags: int = 0) -> Script:
        s = Script()
        s.call("cudaStreamCreateWithFlags", flags=flags, outs={"stream": 0x5000})
        for _ in range(4):
            s.launch(0x100, stream=0x5000 if other_stream else 0)
            s.call("cudaMemcpyAsync", dst=0x7f0000100000, src=0x7f0000000000, size=4096,
                   kind="DeviceToDevice", stream=0, line=60)
        return s
    assert analyzed(program(False)).findings() == []  # one stream: nothing to serialise with
    finding, = analyzed(program(True)).findings()
    assert (finding.rule, finding.evidence) == ("default-stream-work",
                                                {"calls": 4, "bytes": 4 * 4096})
    assert finding.where["python"] == "/app/train.py:60 train"
    # a non-blocking stream does not wait for the legacy stream, nor it for it
    assert analyzed(program(True, flags=1)).findings() == []


def test_a_pageable_copy_synchronised_at_once_is_a_synchronous_one():
    s = Script()
    for size in (1 << 20, 1 << 22, 1 << 21):  # a model's weights uploaded the way PyTorch's
        s.call("cudaMemcpyAsync", dst=0x7f0000000000, src=0x55550000, size=size,  # blocking
               kind="HostToDevice", stream=0, line=70)  # copy does: cudaMemcpyAsync, then
        s.call("cudaStreamSynchronize", stream=0, line=70)  # cudaStreamSynchronize
    assert analyzed(s).findings() == []  # (synchronous ones are flagged in steady steps)


def test_a_failed_call_retried_is_no_ignored_error():
    s = Script()
    s.call("cudaMalloc", ret=2, size=1 << 40)  # out of memory: the allocator frees, retries
    s.call("cudaFree", ptr=0x7f0000000000)
    s.call("cudaMalloc", size=1 << 40, outs={"ptr": 0x7f0000000000})
    s.launch(0x100)
    assert analyzed(s).findings() == []


def test_the_step_token_in_the_set_up_and_after_the_loop_makes_no_step():
    s = Script()
    s.call("cudaDeviceSynchronize")  # (a set-up's synchronisations: the token alone)
    s.call("cudaDeviceSynchronize")
    for _ in range(6):
        s.call("cudaDeviceSynchronize")
        for func in (0x100, 0x200, 0x300, 0x400):
            s.launch(func)
        _input(s)
    s.call("cudaDeviceSynchronize")  # (the program's last)
    loop, = analyzed(s).context().loops
    assert len(loop.steps) == 6 and all(len(st.launches) == 4 for st in loop.steps)


def test_a_benchmark_loop_inside_the_first_iteration_is_no_loop():
    s = Script()
    for i in range(6):
        _input(s)
        if i == 0:  # a compiler's autotuning: 40 runs of a kernel after a cache clear
            for _ in range(40):
                s.launch(0x700)
                s.launch(0x800)
        for func in (0x100, 0x200, 0x300):
            s.launch(func)
    loop, = analyzed(s).context().loops
    assert len(loop.steps) == 6 and len(loop.steps[0].launches) == 83


def test_a_replay_loop_beats_a_warm_up_of_more_repetitions_and_other_threads_warm_up():
    s, autograd = Script(), Script(tid=8)
    for _ in range(3):  # warm-up steps: 8 layers each, their backward on another thread
        for _ in range(8):
            s.launch(0x100)
            s.launch(0x200)
        autograd.now = s.now
        for layer in range(8):
            autograd.launch(0x410)
            autograd.launch(0x420 if layer else 0x430)
        s.now = autograd.now
    s.call("cudaStreamBeginCapture", stream=0x5000, mode=0)
    s.launch(0x100, stream=0x5000, outs={"captured": True})
    s.call("cudaStreamEndCapture", stream=0x5000, outs={"graph": 0x6000})
    s.call("cudaGraphInstantiate", graph=0x6000, flags=0, outs={"graphExec": 0x7000})
    for _ in range(10):
        _input(s)
        s.call("cudaGraphLaunch", graphExec=0x7000, stream=0)
    analyzer = Analyzer()
    analyzer.write(sorted(s.events + autograd.events, key=lambda e: e.ts_ns))
    ctx = analyzer.context()
    loop, = ctx.loops
    assert (loop.tid, len(loop.steps)) == (7, 10) and {st.mode for st in loop.steps} == {"graph"}
    warm, = ctx.warm_ups
    assert warm.tid == 8
    assert "Thread 7/8: no steps" in analyzer.report()
    assert [r["type"] for r in analyzer.records()][:3] == ["steps", "warm_up", "graph_replays"]


def _churn(s: Script, line: Optional[int], steps: int = 5) -> None:
    for _ in range(steps):
        s.call("cudaMalloc", size=4096, line=line, outs={"ptr": 0x7f0000000000})
        s.launch(0x100, line=line)
        s.call("cudaFree", ptr=0x7f0000000000, line=line)


def test_threads_of_one_process_with_the_same_problem_make_one_finding():
    main, worker = Script(), Script(tid=8)
    _churn(main, 60)
    _churn(worker, None)  # (no Python stack: a native thread)
    analyzer = Analyzer()
    analyzer.write(main.events + worker.events)
    finding, = analyzer.findings()
    assert finding.evidence["threads"] == ["7/7", "7/8"] == finding.where["thread"]
    assert finding.evidence["allocations"] == 8 and finding.evidence["frees"] == 8
    assert [e["allocations"] for e in finding.evidence["by_thread"].values()] == [4, 4]
    assert finding.where["python"] == "/app/train.py:60 in train"
    # two threads at two lines of the user's: two problems, two findings
    other = Script(tid=9)
    _churn(other, 70)
    analyzer = Analyzer()
    analyzer.write(main.events + other.events)
    assert [f.where["thread"] for f in analyzer.findings()] == ["7/7", "7/9"]


LIBCUDART, APP = "/usr/local/cuda/lib64/libcudart.so.12", "/app/bin/train"


def test_the_native_site_is_the_innermost_frame_outside_the_cuda_libraries():
    from ebpf_cuda.analysis.timeline import native_caller
    from ebpf_cuda.targets.symbols import Frame

    frames = [Frame("cudaStreamSynchronize", 0x12, LIBCUDART),
              None,  # (an address in no file: skipped, not a caller)
              Frame(None, 0x4a10, "/opt/nccl/lib/libnccl.so.2"),
              Frame("step", 0x2c, APP), Frame("main", 0x91, APP)]
    assert native_caller(frames) == "step+0x2c (train)"
    assert native_caller([Frame(None, 0x1f40, "/app/lib/libmodel.so")] + frames) \
        == "libmodel.so+0x1f40"  # (no symbol holds it: the file and offset)
    assert native_caller(frames[:3]) is None  # only CUDA's frames


def test_sites_are_python_lines_else_native_callers_else_the_api_and_thread():
    from ebpf_cuda.targets.symbols import Frame

    stacks = {1: [Frame("cudaStreamSynchronize", 0x12, LIBCUDART), Frame("sync", 0x1c, APP)],
              2: [Frame("cudaStreamBeginCapture", 0x8, LIBCUDART), Frame("capture", 0x30, APP)],
              3: [Frame("cudaGraphLaunch", 0x8, LIBCUDART), Frame("replay", 0x11, APP)]}
    asked = []

    def frames(pid: int, stack_id: int):
        asked.append((pid, stack_id))
        return stacks[stack_id]

    s = Script()
    s.call("cudaStreamBeginCapture", stream=0x5000, mode=0).stack_id = 2
    s.launch(0x100, stream=0x5000, outs={"captured": True})
    s.call("cudaStreamEndCapture", stream=0x5000, outs={"graph": 0x6000})
    s.call("cudaGraphInstantiate", graph=0x6000, flags=0, outs={"graphExec": 0x7000})
    for _ in range(5):
        s.call("cudaGraphLaunch", graphExec=0x7000, stream=0x5000).stack_id = 3
        s.call("cudaStreamSynchronize", took=400 * US, stream=0x5000).stack_id = 1
        s.now += 200 * US
    s.call("cudaStreamSynchronize", stream=0x5000, line=21).stack_id = 1  # (a Python line)
    analyzer = Analyzer(stacks=frames)
    analyzer.write(s.events)
    finding, = analyzer.findings()
    assert finding.rule == "sync-in-step" and finding.where["python"] is None
    assert finding.where["native"] == "sync+0x1c (train)"
    assert analyzer.context().captures == {(7, 0x7000): "capture+0x30 (train)"}
    sites = [c.site for c in analyzer.context().calls if c.api == "cudaStreamSynchronize"]
    assert sites == ["sync+0x1c (train)"] * 5 + ["/app/train.py:21 train"]
    assert sorted(set(asked)) == [(7, 1), (7, 2), (7, 3)] and len(asked) == 3  # once each
    plain = analyzed(s)  # no stacks given (a trace without --stacks): the API and thread
    assert plain.findings()[0].where["native"] is None
    assert plain.context().calls[0].site == "cudaStreamBeginCapture (thread 7, no Python stack)"
