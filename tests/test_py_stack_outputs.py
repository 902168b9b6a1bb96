"""--py-stacks in every output, on hand-made events and records (no probes): text and JSON
lines (the fast path from frames as the writers from events), the summary's table by Python
line, the leak report, the timeline's arguments and the HTML report."""
import io
import json
import random
from typing import Dict, List, Tuple

import pytest

from ebpf_cuda.spec import record
from ebpf_cuda.analysis import LeakTracker, Summary, format_leaks
from ebpf_cuda.analysis.python_lines import (NO_STACK, PythonLines, frame_text, is_user_file,
                                             line_suffix, user_frame, user_line)
from ebpf_cuda.spec.apis import TABLE
from ebpf_cuda.decode.events import ENTER, EXIT, Decoder, Event, PyFrame
from ebpf_cuda.output import DecodeContext
from ebpf_cuda.output.chrome_trace import ChromeTraceWriter
from ebpf_cuda.output.html_report import HtmlReport
from ebpf_cuda.output.jsonl import JsonWriter
from ebpf_cuda.output.text import TextWriter, format_event
from helpers import event
from records import pack_frame

PID = 4242
TRAIN = PyFrame("/home/me/train.py", 42, "Model.step")
MAIN = PyFrame("/home/me/train.py", 90, "<module>")
TORCH = PyFrame("/venv/lib/python3.11/site-packages/torch/nn/functional.py", 1500, "linear")
STDLIB = PyFrame("/usr/lib/python3.11/threading.py", 975, "run")
FROZEN = PyFrame("<frozen importlib._bootstrap>", 241, "_call_with_frames_removed")
STACK = (TORCH, TRAIN, MAIN)  # innermost first: the user frame is the second
OTHER = (PyFrame("/home/me/train.py", 57, "Model.sync"), MAIN)
OFFSET = 1_700_000_000 * 10**9  # the decoder's clock offset in the record tests


def ev(api, args=None, ret=0, duration=1000, outs=None, ts_ns=10**9, phase=EXIT,
       py_stack=STACK, tid=PID):
    e = event(api, phase, args, ts_ns=ts_ns, pid=PID, tid=tid, ret=ret,
              ret_name="cudaSuccess" if ret == 0 else "error%d" % ret,
              duration_ns=duration if phase == EXIT else None, outs=dict(outs or {}))
    e.py_stack = py_stack
    return e


# ---- frames ---------------------------------------------------------------------------------

@pytest.mark.parametrize("frame, user", [
    (TRAIN, True), (PyFrame("train.py", 1, "f"), True), (TORCH, False), (STDLIB, False),
    (PyFrame("/usr/lib/python3/dist-packages/numpy/core.py", 1, "f"), False),
    (PyFrame("/root/.pyenv/versions/3.13.0/lib/python3.13/asyncio/events.py", 1, "f"), False),
    (PyFrame("/usr/lib/python313t.zip/json/decoder.py", 1, "f"), False),
    (PyFrame("/usr/lib/python3.13t/json/decoder.py", 1, "f"), False),
    (FROZEN, False), (PyFrame("<string>", 1, "<module>"), False),
    (PyFrame("<stdin>", 3, "<module>"), True),
    # torch.compile's generated wrapper (it captures and replays the CUDA graphs)
    (PyFrame("/tmp/torchinductor_root/ba/cba4kh3toyic644vvkbznuisum54qbav5fsvs6w7bjuzt7e43pll.py",
             241, "call"), False),
    (PyFrame("/home/u/.triton/cache/Xk2/launcher.py", 9, "launch"), False),
    (PyFrame("/home/u/torchinductor_notes.py", 9, "f"), True),
    (PyFrame("<ipython-input-4-abc>", 2, "<module>"), True)])
def test_user_files_are_those_outside_the_interpreter_and_packages(frame, user):
    assert is_user_file(frame.file) is user


def test_the_user_frame_is_the_innermost_user_one_else_the_innermost():
    assert user_frame(STACK) == TRAIN
    assert user_frame((FROZEN, STDLIB)) == FROZEN
    assert user_frame(None) is None and user_frame(()) is None
    assert user_line(STACK) == "/home/me/train.py:42 Model.step"
    assert user_line(None) == NO_STACK


def test_a_frame_without_a_line_shows_a_question_mark():
    frame = PyFrame("/a.py", None, "f")
    assert frame_text(frame) == "/a.py:? f"
    assert line_suffix((frame,)) == " at /a.py:? (f)"
    assert line_suffix(None) == "" and line_suffix(()) == ""


# ---- text and JSON from events -------------------------------------------------------------

def test_text_lines_end_with_the_innermost_frame():
    enter = ev("cudaMalloc", {"size": 4000}, phase=ENTER)
    done = ev("cudaMalloc", {"size": 4000}, outs={"ptr": 0x7F0000000000}, duration=12_345,
              tid=PID + 1)
    suffix = " at /venv/lib/python3.11/site-packages/torch/nn/functional.py:1500 (linear)"
    assert format_event(enter, timestamps=False) == (
        "app              4242    cudaMalloc            [ENTER] size=4000 bytes" + suffix)
    assert format_event(done, timestamps=False, container="abc") == (
        "app              4242    cudaMalloc             [EXIT] returned=cudaSuccess "
        "ptr=0x7f0000000000 (12.3 us) tid=4243 container=abc" + suffix)


def test_text_lines_without_a_stack_are_unchanged():
    plain = ev("cudaMalloc", {"size": 4000}, phase=ENTER, py_stack=None)
    assert format_event(plain, timestamps=False) == (
        "app              4242    cudaMalloc            [ENTER] size=4000 bytes")


def test_json_has_the_whole_stack_innermost_first():
    done = ev("cudaMalloc", {"size": 4000}, outs={"ptr": 16}, duration=7)
    stream = io.StringIO()
    JsonWriter(stream).write([done])
    obj = json.loads(stream.getvalue())
    assert obj["py_stack"] == [
        {"file": TORCH.file, "line": 1500, "function": "linear"},
        {"file": TRAIN.file, "line": 42, "function": "Model.step"},
        {"file": MAIN.file, "line": 90, "function": "<module>"}]
    assert list(obj)[-1] == "py_stack"


# ---- text and JSON from records: the fast path as the decoder's ----------------------------

STACKS: Dict[int, Tuple[PyFrame, ...]] = {7: STACK, 9: OTHER,
                                          11: (PyFrame("/b.py", None, "g"),)}


class FakePyStacks:
    """Sets `py_stack` from `py_stack_id` as pystacks.py does (11 is a stack the process's
    interpreter is not known for: no stack)."""

    def __init__(self) -> None:
        self.seen: List[int] = []

    def annotate(self, events: List[Event]) -> None:
        for e in events:
            self.seen.append(e.py_stack_id)
            if e.py_stack_id and e.py_stack_id != 13:
                e.py_stack = STACKS[e.py_stack_id]


def _frame(api, cells, ret=0, outs=(0, 0), phase=record.PHASE_CALL, py=0, flags=0,
           ts=5 * 10**9, took=12_345, pid=PID, tid=PID, comm=b"train") -> bytes:
    return pack_frame(api, ts, cells, ret, outs, exit_ts=ts + took, phase=phase, flags=flags,
                      pid=pid, tid=tid, comm=comm, py_stack=py)


def _both_ways(frames: bytes, as_json: bool) -> Tuple[List[str], List[str]]:
    """(the lines from decoded, annotated events; the lines of the fast path)."""
    def writer():
        stream = io.StringIO()
        made = JsonWriter(stream) if as_json else TextWriter(stream, timestamps=True)
        return made, stream

    (slow, slow_out), (fast, fast_out) = writer(), writer()
    events = Decoder(TABLE, clock_offset_ns=OFFSET).decode_batch(frames)
    FakePyStacks().annotate(events)
    slow.write(events)
    fast.bind(DecodeContext(annotate=FakePyStacks().annotate))
    fast.write_frames(frames, Decoder(TABLE, clock_offset_ns=OFFSET))
    return slow_out.getvalue().splitlines(), fast_out.getvalue().splitlines()


def test_a_record_with_a_python_stack_is_a_line_with_its_frame():
    frames = _frame("cudaMalloc", [0, 4000], outs=(0x7F0000000000, 0), py=7)
    slow, fast = _both_ways(frames, as_json=False)
    assert fast == slow and len(fast) == 2
    suffix = " at %s:1500 (linear)" % TORCH.file
    assert fast[0].endswith("cudaMalloc            [ENTER] size=4000 bytes" + suffix)
    assert fast[1].endswith("returned=cudaSuccess ptr=0x7f0000000000 (12.3 us)" + suffix)


def test_a_record_with_a_python_stack_is_json_with_it():
    frames = _frame("cudaMalloc", [0, 4000], outs=(0x7F0000000000, 0), py=9)
    slow, fast = _both_ways(frames, as_json=True)
    assert fast == slow
    for line in fast:
        assert json.loads(line)["py_stack"] == [f.to_json() for f in OTHER]


def test_the_fast_path_asks_the_annotation_for_records_with_stacks_only():
    frames = (_frame("cudaMalloc", [0, 4000], outs=(16, 0))
              + _frame("cudaFree", [16], py=7))
    fast = TextWriter(io.StringIO())
    seen = FakePyStacks()
    fast.bind(DecodeContext(annotate=seen.annotate))
    fast.write_frames(frames, Decoder(TABLE, clock_offset_ns=OFFSET))
    assert seen.seen == [7, 7]  # (the free's enter and exit; the malloc took the fast path)


@pytest.mark.parametrize("as_json", [False, True])
def test_fast_lines_equal_decoded_lines_with_and_without_stacks(as_json):
    rng = random.Random(18)
    names = ["cudaMalloc", "cudaFree", "cudaMemcpy", "cudaLaunchKernel",
             "cudaStreamSynchronize", "cuMemAlloc_v2", "cudaMemset"]
    frames = b"".join(
        _frame(rng.choice(names), [rng.randrange(1 << 40) for _ in range(record.ARG_CELLS)],
               ret=rng.choice([0, 0, 2]), outs=(rng.randrange(1 << 40), 0),
               phase=rng.choice([record.PHASE_CALL, record.PHASE_ENTER]),
               py=rng.choice([0, 7, 9, 11, 13]), ts=rng.randrange(10**9, 10**12),
               tid=rng.choice([PID, PID + 1]))
        for _ in range(400))
    slow, fast = _both_ways(frames, as_json)
    assert len(fast) == len(slow) > 400
    assert fast == slow
    assert any((" at " in line or '"py_stack"' in line) for line in fast)
    assert not all((" at " in line or '"py_stack"' in line) for line in fast)


# ---- the summary's table by Python line ----------------------------------------------------

SYNC_LINE = "/home/me/train.py:57 Model.sync"
STEP_LINE = "/home/me/train.py:42 Model.step"


def _calls() -> List[Event]:
    return [
        ev("cudaMalloc", {"size": 4000}, outs={"ptr": 0x1000}, duration=3000, ts_ns=1000),
        ev("cudaMalloc", {"size": 8}, ret=2, duration=500, ts_ns=2000),  # failed: no bytes
        ev("cudaLaunchKernel", {"func": 0xA, "grid": (1, 1, 1), "block": (32, 1, 1)},
           duration=2000, ts_ns=3000),
        ev("cudaLaunchKernel", {"func": 0xA, "grid": (1, 1, 1), "block": (32, 1, 1)},
           outs={"captured": True}, duration=1000, ts_ns=4000),  # recorded, not run
        ev("cudaMemsetAsync", {"ptr": 0x1000, "value": 0, "size": 4000, "stream": 0},
           duration=100, ts_ns=5000),
        ev("cudaMemcpy", {"dst": 1, "src": 2, "size": 300, "kind": "DeviceToHost"},
           duration=50_000, ts_ns=6000, py_stack=OTHER),  # a synchronous copy blocks
        ev("cudaStreamSynchronize", {"stream": 0}, duration=90_000, ts_ns=7000,
           py_stack=OTHER),
        ev("cudaDeviceSynchronize", duration=400, ts_ns=8000, py_stack=None),
        ev("cudaMemcpyAsync", {"dst": 1, "src": 2, "size": 64, "kind": "HostToDevice",
                               "stream": 0}, duration=600, ts_ns=9000, py_stack=OTHER),
    ]


def _rows(text: str) -> Dict[str, List[str]]:
    section = text.split(" ** CUDA API by Python Line (innermost user frame):")[1]
    rows = {}
    for line in section.strip("\n").split("\n")[2:]:
        if not line.strip():
            break
        cells = line.split()
        rows[" ".join(cells[8:])] = cells[:8]
    return rows


def test_the_summary_has_a_row_per_innermost_user_frame():
    summary = Summary()
    summary.add(_calls())
    rows = _rows(summary.report())
    # Time (%), API time, calls, launches, allocated, copied, set, sync time
    assert rows == {
        SYNC_LINE: ["95.3", "140,600", "3", "0", "0", "364", "0", "140,000"],
        STEP_LINE: ["4.5", "6,600", "5", "1", "4,000", "0", "4,000", "0"],
        NO_STACK: ["0.3", "400", "1", "0", "0", "0", "0", "400"]}
    assert list(rows) == [SYNC_LINE, STEP_LINE, NO_STACK]  # by API time


def test_the_summary_has_no_python_table_without_stacks():
    summary = Summary()
    calls = _calls()
    for e in calls:
        e.py_stack = None
    summary.add(calls)
    assert "Python" not in summary.report()


def test_an_enter_event_with_a_stack_shows_the_table():
    summary = Summary()
    summary.add([ev("cudaMalloc", {"size": 1}, phase=ENTER)])
    assert "by Python Line" in summary.report()
    assert "(no completed calls)" in summary.python_lines.table()


def test_calls_before_the_first_stack_count_when_the_trace_has_stacks():
    early = ev("cudaFree", {"ptr": 0}, duration=10, ts_ns=1, py_stack=None)
    late = ev("cudaFree", {"ptr": 0}, duration=20, ts_ns=2)
    auto, told = Summary(), Summary(py_stacks=True)
    for summary in (auto, told):
        summary.add([early, late])
    assert NO_STACK not in _rows(auto.report())
    assert _rows(told.report())[NO_STACK][1:3] == ["10", "1"]


def test_both_layers_count_once_at_the_runtime_call():
    inner = ev("cuMemAlloc_v2", {"size": 4000}, outs={"ptr": 0x1000}, duration=500,
               ts_ns=1800, py_stack=STACK)
    outer = ev("cudaMalloc", {"size": 4000}, outs={"ptr": 0x1000}, duration=1000, ts_ns=2000)
    direct = ev("cuMemAlloc_v2", {"size": 64}, outs={"ptr": 0x9000}, duration=30,
                ts_ns=5000, py_stack=OTHER)
    summary = Summary()
    summary.add([inner, outer, direct])
    rows = _rows(summary.report())
    assert rows[STEP_LINE][1:5] == ["1,000", "1", "0", "4,000"]
    assert rows[SYNC_LINE][1:5] == ["30", "1", "0", "64"]  # (held back, counted at the end)


def test_graph_launches_count_the_kernels_of_their_nodes():
    nodes = [{"type": "kernel", "func": 1}, {"type": "memset"},
             {"type": "graph", "nodes": [{"type": "kernel", "func": 2},
                                         {"type": "kernel", "func": 3}]}]
    lines = PythonLines()
    lines.add([ev("cudaGraphLaunch", {"graphExec": 1, "stream": 0}, outs={"nodes": nodes})])
    assert lines.rows()[0][3] == "3"


def test_the_table_shows_the_top_rows_and_says_how_many_more():
    lines = PythonLines()
    lines.add([ev("cudaFree", {"ptr": 0}, duration=100 + i, ts_ns=i,
                  py_stack=(PyFrame("/s.py", i, "f"),)) for i in range(25)])
    text = lines.table()
    assert "(5 more Python lines not shown)" in text
    assert "/s.py:24 f" in text and "/s.py:4 f" not in text
    assert len(lines.rows(limit=None)) == 25


def test_split_summaries_have_the_table_per_part():
    from ebpf_cuda.analysis.summary import SplitSummary

    calls = _calls()
    for e in calls:
        e.device = 0
    split = SplitSummary()
    split.add(calls)
    assert _rows(split.report())[SYNC_LINE][2] == "3"


@pytest.mark.parametrize("api, blocking", [
    ("cudaStreamSynchronize", True), ("cudaDeviceSynchronize", True),
    ("cudaEventSynchronize", True), ("cuCtxSynchronize", True), ("cuStreamSynchronize", True),
    ("cudaMemcpy", True), ("cuMemcpyDtoH_v2", True), ("cudaMemcpyAsync", False),
    ("cudaMemset", False), ("cudaLaunchKernel", False), ("cudaMalloc", False)])
def test_sync_time_is_that_of_synchronising_calls_and_synchronous_copies(api, blocking):
    from ebpf_cuda.decode.operations import is_blocking

    assert is_blocking(ev(api)) is blocking


# ---- leaks ---------------------------------------------------------------------------------

def test_each_leak_shows_its_python_stack():
    tracker = LeakTracker()
    tracker.feed_all([
        ev("cudaMalloc", {"size": 4096}, outs={"ptr": 0x7F0000000000}),
        ev("cudaMalloc", {"size": 64}, outs={"ptr": 0x7F0000100000}, py_stack=None,
           ts_ns=2 * 10**9)])
    report = format_leaks(tracker).split("\n")
    assert report[3].split()[2] == "0x7f0000000000"
    assert report[4:7] == [
        "      py#0 %s:1500 linear" % TORCH.file,
        "      py#1 /home/me/train.py:42 Model.step",
        "      py#2 /home/me/train.py:90 <module>"]
    assert report[7].split()[2] == "0x7f0000100000" and len(report) == 8


def test_leaks_show_the_python_stack_after_the_native_one():
    from ebpf_cuda.analysis import AddressResolver

    tracker = LeakTracker()
    malloc = ev("cudaMalloc", {"size": 4096}, outs={"ptr": 0x7F0000000000})
    malloc.stack_id = 1
    tracker.feed_all([malloc])
    report = format_leaks(tracker, lambda stack_id: [], AddressResolver()).split("\n")
    assert report[4] == "      (no stack)"
    assert report[5] == "      py#0 %s:1500 linear" % TORCH.file


# ---- the timeline --------------------------------------------------------------------------

def _trace(events: List[Event]) -> List[dict]:
    stream = io.StringIO()
    stream.close = lambda: None  # (read after the writer closes it)
    writer = ChromeTraceWriter(stream)
    writer.write(events)
    writer.close()
    return json.loads(stream.getvalue())


PY_ARGS = {"py_frame": "%s:1500 linear" % TORCH.file, "py_line": STEP_LINE,
           "py_stack": ["%s:1500 linear" % TORCH.file, STEP_LINE,
                        "/home/me/train.py:90 <module>"]}


def test_a_call_slice_carries_its_python_stack():
    trace = _trace([ev("cudaFree", {"ptr": 0x10}, phase=ENTER, ts_ns=1000),
                    ev("cudaFree", {"ptr": 0x10}, ts_ns=3000, duration=2000),
                    ev("cudaMemset", {"ptr": 0x10, "value": 0, "size": 8}, phase=ENTER,
                       ts_ns=9000, py_stack=None)])
    call = next(t for t in trace if t.get("ph") == "X")
    assert call["name"] == "cudaFree"
    assert {k: call["args"][k] for k in PY_ARGS} == PY_ARGS
    marker = next(t for t in trace if t.get("cat") == "enter")
    assert not any(k.startswith("py_") for k in marker["args"])


def test_an_enter_marker_and_a_leak_carry_the_python_stack():
    trace = _trace([ev("cudaMalloc", {"size": 8}, phase=ENTER, ts_ns=1000),
                    ev("cudaMalloc", {"size": 8}, outs={"ptr": 0x7F0000000000}, ts_ns=9000,
                       duration=500, py_stack=OTHER)])
    marker = next(t for t in trace if t.get("cat") == "enter")
    assert marker["args"]["py_frame"] == PY_ARGS["py_frame"]
    leak = next(t for t in trace if t.get("name") == "leak")
    assert leak["args"]["py_frame"] == leak["args"]["py_line"] == SYNC_LINE
    assert leak["args"]["ptr"] == "0x7f0000000000"


# ---- the HTML report -----------------------------------------------------------------------

def _page(events: List[Event]) -> str:
    stream = io.StringIO()
    stream.close = lambda: None  # (read after the report closes it)
    report = HtmlReport(stream)
    report.write(events)
    report.close()
    return stream.getvalue()


def test_the_html_report_has_the_table_by_python_line():
    page = _page(_calls())
    assert "<h2>Calls by Python line (innermost user frame)</h2>" in page
    row = page.split("<td>%s</td>" % SYNC_LINE)[1].split("</tr>")[0]
    assert row == ("<td>95.3</td><td>140,600</td><td>3</td><td>0</td><td>0</td><td>364</td>"
                   "<td>0</td><td>140,000</td>")
    assert page.index(SYNC_LINE) < page.index(STEP_LINE)


def test_the_html_report_shows_each_leak_s_innermost_frame():
    page = _page(_calls())
    leaks = page.split("<h2>Leaks (not freed by the end)</h2>")[1]
    assert "<th>Python frame</th>" in leaks
    assert "<td>%s:1500 linear</td>" % TORCH.file in leaks.split("</table>")[0]


def test_the_html_report_without_stacks_has_no_python_parts():
    calls = _calls()
    for e in calls:
        e.py_stack = None
    page = _page(calls)
    assert "Python" not in page
