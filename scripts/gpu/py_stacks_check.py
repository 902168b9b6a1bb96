"""Issue 18 on the GPU host: which line of a PyTorch training loop each CUDA call came from.

    python3 scripts/gpu/py_stacks_check.py [--out DIR] [--tracer "python3 ebpf-cuda.pyz"]
                                           [--steps 30] [--cost-steps 100] [--rounds 3]
    python3 scripts/gpu/py_stacks_check.py --dry-run [--out DIR]     (no GPU, no torch)

As root, with the tracer importable (on the GPU host: `export PYTHONPATH=$PWD/ebpf-cuda.pyz`;
run.sh's `lines` does that); --tracer defaults to $TRACER, else `python3 -m ebpf_cuda`. Only
the standard library and torch are needed. Prints one PASS/FAIL line per check (`SKIP` and
exit status 77 without torch) and writes DIR/py_stacks_check.json (DIR: --out, else $OUT,
else a temporary folder); exit status 0 when every check passed. `--rounds 0` leaves the
cost runs out (run.sh does, to save device time).

The loop (written by this script to DIR/loop/loop.py, so its line numbers are known by
construction): an MLP (1024-2048-2048-1024, batch 1024) with MSE loss and Adam, fixed seed,
deterministic algorithms, no TF32. Every statement that may call CUDA sits alone on a line
tagged `# PHASE name` (import, configure, model, data, optimizer, anchor, then per step
forward, loss, zero_grad, backward, step, item; anchor_end, checksum), and the line before
each one records `mark(name)` (CLOCK_MONOTONIC ns) into a list the loop writes out with its
losses. It prints `loop: final_loss=... checksum=...`.

Runs: the loop untraced; under `TRACER --json --py-stacks -o FILE` (the attribution run);
under `TRACER --summary --py-stacks`; once more with --json and PyTorch's autograd
multithreading off (`torch.autograd.set_multithreading_enabled(False)`: backward runs on the
calling thread, so its calls have the loop's frames too); then ROUNDS rounds of untraced,
`TRACER -o /dev/null` and `TRACER --py-stacks -o /dev/null` for the cost per step.

Definitions (what the checks measure):
- Categories, by function name: launches `cu(da)?Launch(Cooperative)?Kernel*`; allocations
  `cudaMalloc*`, `cuMemAlloc*`; synchronising calls: the tracer's blocking rows
  (sync category and synchronous copies: cudaStreamSynchronize, cudaDeviceSynchronize,
  cudaEventSynchronize, cuStreamSynchronize, cuCtxSynchronize, cuEventSynchronize,
  cudaMemcpy, cudaMemcpy2D, cudaMemcpyPeer, cuMemcpy, cuMemcpyHtoD/DtoH/DtoD_v2). Each
  call counted once per probed function (a runtime call and the driver call under it are
  two calls with the same stack).
- A call's phase: the window [mark(p), next mark) of the loop's marks that holds its entry
  time (exit `ts` minus `duration_ns`), the trace's wall clock turned into the loop's
  CLOCK_MONOTONIC by the tracer's clock offset, found from the two `torch.cuda.synchronize()`
  anchors: each cudaDeviceSynchronize's entry and exit lie inside its window, which bounds
  the offset; the loop's own measurement of it (just after the tracer's), clamped into those
  bounds, is the one used (unclamped where no anchor was found). Calls before the first or
  after the last mark are counted apart ("outside"), not in the shares.
- Its attributed line: the line of the first frame of its `py_stack`, innermost first, whose
  file is the loop's; none if no frame is (or no py_stack).
- Attributed right: attributed line == the phase's PHASE line (phases without a line, the
  loop's bookkeeping between steps, expect no calls: any call there is wrong).
- The shares (target >= 99%): for the attribution run, the calls on the loop's own thread
  (PyTorch's autograd worker makes backward's calls on a thread with no Python frames: they
  are reported apart, with the share of them that fall inside backward() windows); for the
  inline-backward run, every thread's calls, and backward's launches must all be on the
  backward line.
- The summary check: in `--summary --py-stacks`'s table "by Python line", the row with the
  largest Sync Time is the `.item()` line.
- Cost per step: per run, the median over steps (after 3 warm-up steps) of a step's time
  (mark(forward) to the next) and of its issue time (mark(forward) to mark(item): the CPU
  side of the step, before it waits for the GPU); the median over rounds of each mode, and
  the same round's --py-stacks minus plain trace.

--dry-run: the same runs and analysis on this machine without a GPU or torch: the loop's
statements call a stand-in module (DIR/loop/site-packages/fakeops.py: not the loop's file,
and library code to the summary's "innermost user frame", as torch's files are) that calls
libcudart.so.12 through ctypes (NVIDIA's wheel: every call fails with 35 without a driver,
and is traced all the same), with backward's launches made on a worker thread with
no frames of the loop's file, as PyTorch's autograd does. It runs the real tracer (root).
"""
import argparse
import gzip
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

TARGET = 99.0  # % attributed right, per category
WARMUP_STEPS = 3  # steps left out of the per-step times

# -- the loop ---------------------------------------------------------------------------------

LOOP_TEMPLATE = '''\
"""py_stacks_check.py's training loop (written by it; do not edit: the checks know its
lines). argv: STEPS RESULT_JSON; PYSTACK_LOOP_INLINE_BACKWARD=1: autograd on this thread."""
import json
import os
import sys
import threading
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # (deterministic cuBLAS)
STEPS, RESULT = int(sys.argv[1]), sys.argv[2]
INLINE = os.environ.get("PYSTACK_LOOP_INLINE_BACKWARD") == "1"
BATCH, IN, HID, OUT = 1024, 1024, 2048, 1024
MARKS = []
OFFSET_START = time.time_ns() - time.monotonic_ns()
_now = time.monotonic_ns


def mark(phase):
    MARKS.append((phase, _now()))


def train():
    mark("import")
    {import_}  # PHASE import
    mark("configure")
    {configure}  # PHASE configure
    mark("model")
    {model}  # PHASE model
    mark("data")
    {data}  # PHASE data
    mark("optimizer")
    {optimizer}  # PHASE optimizer
    mark("anchor")
    {anchor}  # PHASE anchor
    mark("idle")
    losses = []
    for step in range(STEPS):
        mark("forward")
        {forward}  # PHASE forward
        mark("loss")
        {loss}  # PHASE loss
        mark("zero_grad")
        {zero_grad}  # PHASE zero_grad
        mark("backward")
        {backward}  # PHASE backward
        mark("step")
        {step}  # PHASE step
        mark("item")
        {item}  # PHASE item
        mark("idle")
        losses.append(value)
    mark("anchor_end")
    {anchor}  # PHASE anchor_end
    mark("checksum")
    {checksum}  # PHASE checksum
    mark("end")
    return losses, checksum


losses, checksum = train()
print("loop: final_loss=%r checksum=%r steps=%d" % (losses[-1], checksum, STEPS), flush=True)
torch_module = sys.modules.get("torch")
with open(RESULT, "w") as out:
    json.dump({{"pid": os.getpid(), "tid": threading.get_native_id(), "marks": MARKS,
               "losses": losses, "checksum": checksum, "offset_start": OFFSET_START,
               "offset_end": time.time_ns() - time.monotonic_ns(), "python": sys.version,
               "inline_backward": INLINE,
               "torch": getattr(torch_module, "__version__", None)}}, out)
'''

TORCH_STATEMENTS = {
    "import_": "import torch",
    "configure": ("torch.manual_seed(0); torch.use_deterministic_algorithms(True, "
                  "warn_only=True); torch.backends.cuda.matmul.allow_tf32 = False; "
                  "torch.backends.cudnn.allow_tf32 = False; "
                  "torch.autograd.set_multithreading_enabled(not INLINE)"),
    "model": ("model = torch.nn.Sequential(torch.nn.Linear(IN, HID), torch.nn.ReLU(), "
              "torch.nn.Linear(HID, HID), torch.nn.ReLU(), torch.nn.Linear(HID, OUT)).cuda()"),
    "data": "x, y = torch.randn(BATCH, IN).cuda(), torch.randn(BATCH, OUT).cuda()",
    "optimizer": "opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)",
    "anchor": "torch.cuda.synchronize()",
    "forward": "out = model(x)",
    "loss": "loss = torch.nn.functional.mse_loss(out, y)",
    "zero_grad": "opt.zero_grad(set_to_none=True)",
    "backward": "loss.backward()",
    "step": "opt.step()",
    "item": "value = loss.item()",
    "checksum": "checksum = sum(float(p.double().sum()) for p in model.parameters())",
}

STANDIN_STATEMENTS = {
    "import_": "import fakeops",
    "configure": "fakeops.configure(INLINE)",
    "model": "model = fakeops.Model()",
    "data": "x, y = fakeops.data()",
    "optimizer": "opt = fakeops.Optimizer(model)",
    "anchor": "fakeops.synchronize()",
    "forward": "out = model.forward(x)",
    "loss": "loss = fakeops.mse_loss(out, y)",
    "zero_grad": "opt.zero_grad()",
    "backward": "loss.backward()",
    "step": "opt.step()",
    "item": "value = loss.item()",
    "checksum": "checksum = model.checksum()",
}

# The stand-in "torch" of --dry-run: CUDA calls through ctypes from this module's own lines
# (not the loop's file); backward's launches on a worker thread, as autograd's device thread.
FAKEOPS = '''\
import ctypes
import os
import queue
import threading
import time

LIB = ctypes.CDLL(os.environ["PYSTACK_FAKE_LIB"])


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


LIB.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t,
                                 ctypes.c_void_p]
LIB.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
LIB.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                ctypes.c_int, ctypes.c_void_p]
LIB.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
_device_sync = LIB.cudaDeviceSynchronize
PAD_NS = 20000  # each op spends this long in Python before its CUDA calls, as torch's dispatch


def pad():
    end = time.perf_counter_ns() + PAD_NS
    while time.perf_counter_ns() < end:
        pass
_buffer = ctypes.create_string_buffer(1 << 16)
_inline = [False]
_allocated = set()


def malloc(size, tag):
    if tag in _allocated:  # (a caching allocator: each block once)
        return
    _allocated.add(tag)
    pointer = ctypes.c_void_p()
    pad()
    LIB.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(size))


def launch(n):
    pad()
    LIB.cudaLaunchKernel(0x1000 + n, Dim3(n, 1, 1), Dim3(256, 1, 1), None, 0, None)


def copy(size, kind):
    pad()
    LIB.cudaMemcpy(ctypes.addressof(_buffer), ctypes.addressof(_buffer), size, kind)


def configure(inline):
    _inline[0] = inline


def synchronize():
    _device_sync()


def data():
    malloc(4096, "x")
    malloc(4096, "y")
    copy(4096, 1)
    return 1.0, 2.0


class Model:
    def __init__(self):
        for k in range(3):
            malloc(65536, "w%d" % k)
            copy(4096, 1)
        self.weight = 0.5

    def forward(self, x):
        malloc(1 << 20, "activations")
        for k in range(3):
            launch(k + 1)
        return x * self.weight

    def checksum(self):
        copy(8, 2)
        return round(self.weight, 12)


class Loss:
    def __init__(self, value, model):
        self.value, self.model = value, model

    def backward(self):
        if _inline[0]:
            _backward(self)
        else:
            done = threading.Event()
            _WORK.put((self, done))
            done.wait()

    def item(self):
        pad()
        LIB.cudaMemcpyAsync(ctypes.addressof(_buffer), ctypes.addressof(_buffer), 4, 2, None)
        for _ in range(3):
            LIB.cudaStreamSynchronize(None)
        return self.value


def _backward(loss):
    malloc(1 << 20, "grads")
    for k in range(4):
        launch(10 + k)
    loss.model.weight *= 0.9


_WORK = queue.Queue()


def _worker():
    while True:
        loss, done = _WORK.get()
        _backward(loss)
        done.set()


threading.Thread(target=_worker, daemon=True, name="fake_autograd").start()


def mse_loss(out, y):
    launch(5)
    return Loss(round((out - y) ** 2, 12), _MODEL[0])


_MODEL = [None]
_init = Model.__init__


def _remember(self):
    _init(self)
    _MODEL[0] = self


Model.__init__ = _remember


class Optimizer:
    def __init__(self, model):
        self.model = model

    def zero_grad(self):
        pass

    def step(self):
        malloc(65536, "exp_avg")
        malloc(65536, "exp_avg_sq")
        launch(20)
        launch(21)
'''

PHASE_TAG = re.compile(r"#\s*PHASE\s+(\w+)\s*$")


def write_loop(folder: str, standin: bool) -> Tuple[str, Dict[str, int]]:
    """Write the loop (and the stand-in module) into `folder`: its path, and each phase's
    line number (from the `# PHASE` tags)."""
    os.makedirs(folder, exist_ok=True)
    statements = STANDIN_STATEMENTS if standin else TORCH_STATEMENTS
    path = os.path.join(folder, "loop.py")
    with open(path, "w") as f:
        f.write(LOOP_TEMPLATE.format(**statements))
    if standin:  # (in a site-packages folder: library code to the summary, as torch is)
        os.makedirs(os.path.join(folder, "site-packages"), exist_ok=True)
        with open(os.path.join(folder, "site-packages", "fakeops.py"), "w") as f:
            f.write(FAKEOPS)
    return path, phase_lines(path)


def phase_lines(path: str) -> Dict[str, int]:
    lines: Dict[str, int] = {}
    with open(path) as f:
        for number, text in enumerate(f, 1):
            found = PHASE_TAG.search(text)
            if found:
                if found.group(1) in lines:
                    raise ValueError("phase %s tagged twice" % found.group(1))
                lines[found.group(1)] = number
    return lines


# -- categories -------------------------------------------------------------------------------

LAUNCH = re.compile(r"^cu(da)?Launch(Cooperative)?Kernel")
ALLOC = re.compile(r"^(cudaMalloc|cuMemAlloc)")
# The tracer's blocking rows (operations.blocks) at the time of writing; its own table is
# used where it can be imported (it is, from the zipapp).
SYNC_NAMES = {"cudaMemcpy", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy2D",
              "cudaMemcpyPeer", "cudaDeviceSynchronize", "cuCtxSynchronize", "cuMemcpy",
              "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemcpyDtoD_v2", "cuStreamSynchronize",
              "cuEventSynchronize"}
CATEGORIES = ("launch", "alloc", "sync")


def sync_names() -> Tuple[set, str]:
    try:
        from ebpf_cuda.decode.operations import blocks
        from ebpf_cuda.spec.apis import TABLE
    except ImportError:
        return set(SYNC_NAMES), "built-in list"
    return {api.name for api in TABLE if blocks(api)}, "the tracer's table"


def category(api: str, syncs: set) -> Optional[str]:
    if LAUNCH.match(api):
        return "launch"
    if ALLOC.match(api):
        return "alloc"
    if api in syncs:
        return "sync"
    return None


# -- analysis ---------------------------------------------------------------------------------


def read_events(path: str) -> List[dict]:
    events = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{") and '"type":"gpu_' not in line:  # (calls only)
                events.append(json.loads(line))
    return events


def calls_of(events: List[dict], pid: int) -> List[dict]:
    """One dict per call of `pid`: api, tid, entry and exit wall ns, py_stack (exit events;
    entry events where a trace has no exits)."""
    mine = [e for e in events if e.get("pid") == pid]
    exits = [e for e in mine if e.get("phase") == "exit"]
    calls = []
    for e in exits or [e for e in mine if e.get("phase") == "enter"]:
        end = e["ts"] * 1e9
        start = end - (e.get("duration_ns") or 0) if e.get("phase") == "exit" else end
        calls.append({"api": e["api"], "tid": e["tid"], "start": start, "end": end,
                      "py_stack": e.get("py_stack"), "kernel": e.get("kernel")})
    return calls


def windows(marks: Sequence[Sequence[Any]]) -> Tuple[List[int], List[str]]:
    """The marks as window starts (sorted by construction) and their phases."""
    return [int(t) for _, t in marks], [p for p, _ in marks]


def phase_at(starts: List[int], phases: List[str], mono: float) -> Optional[str]:
    """The phase whose window holds `mono`; None before the first mark or from the last
    mark ("end") on."""
    import bisect

    i = bisect.bisect_right(starts, mono) - 1
    if i < 0 or i >= len(starts) - 1:
        return None
    return phases[i]


def clock_offset(calls: List[dict], result: dict, anchor_phases=("anchor", "anchor_end")
                 ) -> Dict[str, Any]:
    """The tracer's wall-minus-monotonic offset (ns), bounded by the anchors: each
    synchronize's call lies inside its window [mark, next mark]. Falls back to the loop's own
    offset measurement (`offset_start`)."""
    own = result["offset_start"]
    marks = result["marks"]
    tid = result["tid"]
    found: Dict[str, Any] = {"own_offset_ns": own, "anchors": []}
    low, high = float("-inf"), float("inf")
    for api in ("cudaDeviceSynchronize", "cuCtxSynchronize"):
        candidates = [c for c in calls if c["api"] == api and c["tid"] == tid]
        if candidates:
            break
    for index, (phase, t0) in enumerate(marks[:-1]):
        if phase not in anchor_phases:
            continue
        t1 = marks[index + 1][1]
        middle = (t0 + t1) / 2
        if not candidates:
            continue
        best = min(candidates, key=lambda c: abs(c["start"] - own - middle))
        if abs(best["start"] - own - middle) > 50e6:  # (50 ms: not this window's call)
            continue
        # start - offset >= t0 and end - offset <= t1
        low, high = max(low, best["end"] - t1), min(high, best["start"] - t0)
        found["anchors"].append({"phase": phase, "api": best["api"], "window_us":
                                 round((t1 - t0) / 1e3, 1), "bound_ns":
                                 [best["end"] - t1, best["start"] - t0]})
    if found["anchors"] and low <= high:
        # the loop measured the same offset just after the tracer did: the best guess while
        # the clock was not adjusted between the two, and the anchors bound it
        found.update(offset_ns=min(max(own, low), high), bounds_ns=[low, high],
                     uncertainty_ns=high - low,
                     how="anchors" + (" (own offset inside their bounds)" if low <= own <= high
                                      else " (own offset outside their bounds: clamped)"))
    else:
        found.update(offset_ns=own, uncertainty_ns=None,
                     how="own offset (anchors %s)" % ("inconsistent" if found["anchors"]
                                                      else "not found"))
    found["offset_minus_own_us"] = round((found["offset_ns"] - own) / 1e3, 2)
    return found


def script_frame(stack: Optional[List[dict]], script: str) -> Optional[dict]:
    """The innermost frame of `stack` whose file is the loop's."""
    for frame in stack or ():
        if frame.get("file") == script or (frame.get("file")
                                           and os.path.realpath(frame["file"]) == script):
            return frame
    return None


def attribute(calls: List[dict], result: dict, script: str, lines: Dict[str, int],
              syncs: set) -> Dict[str, Any]:
    """Each categorised call's phase and attributed line (see the module's docstring)."""
    offset = clock_offset(calls, result)
    starts, phases = windows(result["marks"])
    main_tid = result["tid"]
    # counts[scope][category] = Counter(right, wrong, no_frame, outside)
    counts: Dict[str, Dict[str, Counter]] = {s: {c: Counter() for c in CATEGORIES}
                                             for s in ("main", "other", "all")}
    by_line: Dict[str, Counter] = defaultdict(Counter)  # category -> Counter(attributed line)
    other_in: Dict[str, Counter] = {c: Counter() for c in CATEGORIES}  # other threads: phase
    wrong: List[dict] = []
    no_stack_main = 0
    for call in calls:
        what = category(call["api"], syncs)
        if what is None:
            continue
        phase = phase_at(starts, phases, call["start"] - offset["offset_ns"])
        frame = script_frame(call["py_stack"], script)
        line = frame.get("line") if frame else None
        scope = "main" if call["tid"] == main_tid else "other"
        if scope == "main" and call["py_stack"] is None:
            no_stack_main += 1
        if scope == "other":
            other_in[what][phase or "outside"] += 1
        if line is not None:
            by_line[what][line] += 1
        if phase is None:
            verdict = "outside"
        elif frame is None:
            verdict = "no_frame"
        elif line == lines.get(phase):
            verdict = "right"
        else:
            verdict = "wrong"
        for s in (scope, "all"):
            counts[s][what][verdict] += 1
        if verdict in ("wrong", "no_frame") and (scope == "main" or frame is not None) \
                and len(wrong) < 20:
            wrong.append({"api": call["api"], "tid": call["tid"], "phase": phase,
                          "expected_line": lines.get(phase), "attributed_line": line,
                          "py_stack": (call["py_stack"] or [])[:4]})
    shares = {}
    for scope, per in counts.items():
        shares[scope] = {}
        for what, c in per.items():
            counted = c["right"] + c["wrong"] + c["no_frame"]
            shares[scope][what] = {"calls": counted, "right": c["right"], "wrong": c["wrong"],
                                   "no_script_frame": c["no_frame"], "outside": c["outside"],
                                   "pct": round(100.0 * c["right"] / counted, 2)
                                   if counted else None}
    line_phase = {line: phase for phase, line in lines.items()}
    return {"clock": offset, "shares": shares, "no_py_stack_on_main_thread": no_stack_main,
            "other_threads": {what: dict(c) for what, c in other_in.items()},
            "attributed_lines": {what: {"%d (%s)" % (line, line_phase.get(line, "?")): n
                                        for line, n in sorted(c.items())}
                                 for what, c in by_line.items()},
            "mismatches": wrong}


# -- the summary's table ----------------------------------------------------------------------

TITLE = "CUDA API by Python Line"
_ROW = re.compile(r"^\s*([\d.]+)\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)\s+"
                  r"([\d,]+)\s+([\d,]+)\s+(\S.*)$")


def python_line_rows(text: str) -> List[Dict[str, Any]]:
    """The rows of the summary's table "by Python line"."""
    rows: List[Dict[str, Any]] = []
    lines = text.splitlines()
    for start, line in enumerate(lines):
        if TITLE in line:
            break
    else:
        return rows
    for line in lines[start + 1:]:
        if rows and not line.strip():
            break
        found = _ROW.match(line)
        if found:
            values = [float(found.group(1))] + [int(g.replace(",", ""))
                                                for g in found.groups()[1:8]]
            rows.append(dict(zip(("pct", "api_ns", "calls", "launches", "allocated", "copied",
                                  "set", "sync_ns"), values), where=found.group(9).strip()))
    return rows


def summary_check(text: str, script: str, item_line: int) -> Dict[str, Any]:
    rows = python_line_rows(text)
    if not rows:
        return {"ok": False, "why": "no table 'by Python line' in the summary", "rows": []}
    top = max(rows, key=lambda r: r["sync_ns"])
    expected = "%s:%d " % (script, item_line)
    return {"ok": top["where"].startswith(expected) and top["sync_ns"] > 0,
            "top_sync_row": top, "expected": expected.strip(), "rows": rows[:12]}


# -- runs -------------------------------------------------------------------------------------


class Runner:
    def __init__(self, tracer: List[str], python: str, loop: str, folder: str,
                 env: Dict[str, str], extra: List[str]) -> None:
        self.tracer, self.python, self.loop, self.folder = tracer, python, loop, folder
        self.env, self.extra = env, extra
        self.count = 0

    def run(self, name: str, options: Optional[List[str]], steps: int, inline: bool = False,
            timeout: float = 300) -> Dict[str, Any]:
        """The loop under `options` (None: untraced): its result, stdout's `loop:` lines,
        the tracer's stdout and stderr."""
        self.count += 1
        result_path = os.path.join(self.folder, "%02d-%s.result.json" % (self.count, name))
        command = [self.python, self.loop, str(steps), result_path]
        if options is not None:
            command = self.tracer + self.extra + options + ["--", *command]
        env = dict(self.env, PYSTACK_LOOP_INLINE_BACKWARD="1" if inline else "0")
        started = time.monotonic()
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env,
                                  timeout=timeout, cwd=self.folder)
        except subprocess.TimeoutExpired as late:
            done = subprocess.CompletedProcess(command, 124, _text(late.stdout),
                                               _text(late.stderr) + "\n(timed out)")
        took = time.monotonic() - started
        with open(os.path.join(self.folder, "%02d-%s.stderr" % (self.count, name)), "w") as f:
            f.write(done.stderr)
        result = None
        if os.path.exists(result_path):
            with open(result_path) as f:
                result = json.load(f)
        lost = re.search(r"ebpf-cuda: (\d+) events lost", done.stderr)
        return {"name": name, "rc": done.returncode, "result": result, "wall_s": round(took, 2),
                "loop_lines": [l for l in done.stdout.splitlines() if l.startswith("loop: ")],
                "stdout": done.stdout, "stderr_tail": done.stderr.splitlines()[-4:],
                "lost": int(lost.group(1)) if lost else 0}


def step_times(result: Optional[dict]) -> Dict[str, Optional[float]]:
    """Median step and issue times (µs) of a run, after the warm-up steps."""
    if not result:
        return {"step_us": None, "issue_us": None}
    forward = [t for p, t in result["marks"] if p == "forward"]
    item = [t for p, t in result["marks"] if p == "item"]
    ends = forward[1:] + [t for p, t in result["marks"] if p == "anchor_end"]
    steps = [(b - a) / 1e3 for a, b in zip(forward, ends)][WARMUP_STEPS:]
    issue = [(b - a) / 1e3 for a, b in zip(forward, item)][WARMUP_STEPS:]
    return {"step_us": statistics.median(steps) if steps else None,
            "issue_us": statistics.median(issue) if issue else None}


def same_results(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    return (a["result"] is not None and b["result"] is not None
            and a["loop_lines"] == b["loop_lines"] and a["loop_lines"] != []
            and a["result"]["losses"] == b["result"]["losses"]
            and a["result"]["checksum"] == b["result"]["checksum"])


# -- main -------------------------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--tracer", default=os.environ.get("TRACER")
                        or "%s -m ebpf_cuda" % shlex.quote(sys.executable))
    parser.add_argument("--python", default=sys.executable, help="the loop's interpreter")
    parser.add_argument("--steps", type=int, default=30, help="steps of the traced loops")
    parser.add_argument("--cost-steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the cost runs")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: the loop calls a ctypes stand-in (see the docstring)")
    parser.add_argument("--lib", help="--dry-run: the libcudart.so.12 to call (default: the "
                                      "nvidia-cuda-runtime-cu12 wheel's)")
    args = parser.parse_args(argv)
    if not args.dry_run:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            print("SKIP lines/all: PyTorch not installed here (the loop is a PyTorch loop)")
            return 77
    out = args.out or tempfile.mkdtemp(prefix="py-stacks-check-")
    os.makedirs(out, exist_ok=True)
    folder = os.path.join(out, "loop")
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    script, lines = write_loop(folder, args.dry_run)
    script = os.path.realpath(script)
    env = dict(os.environ)
    try:  # the loop runs in its own folder: the tracer found where this script found it
        import ebpf_cuda

        where = os.path.dirname(os.path.dirname(os.path.abspath(ebpf_cuda.__file__)))
        if where not in env.get("PYTHONPATH", "").split(os.pathsep):
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [where, env.get("PYTHONPATH")]))
    except ImportError:
        pass
    extra: List[str] = []
    if args.dry_run:
        lib = args.lib or _wheel_libcudart()
        if lib is None:
            print("FAIL dry run: no libcudart.so.12 (pip install nvidia-cuda-runtime-cu12, or "
                  "--lib)")
            return 1
        env["PYSTACK_FAKE_LIB"] = lib
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [
            os.path.join(folder, "site-packages"), env.get("PYTHONPATH")]))
        extra = ["-p", lib]
    runner = Runner(shlex.split(args.tracer), args.python, script, folder, env, extra)
    syncs, sync_source = sync_names()
    print("py_stacks_check: loop %s (%s), phases at lines %s; sync functions from %s"
          % (script, "stand-in" if args.dry_run else "torch", lines, sync_source), flush=True)

    report: Dict[str, Any] = {"loop": script, "phase_lines": lines, "dry_run": args.dry_run,
                              "tracer": args.tracer, "checks": [], "runs": {}}
    checks: List[Tuple[str, bool, str]] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append((name, ok, detail))
        report["checks"].append({"check": name, "ok": ok, "detail": detail})
        print("%s lines/%s: %s" % ("PASS" if ok else "FAIL", name, detail), flush=True)

    trace_json = os.path.join(folder, "trace.jsonl")
    inline_json = os.path.join(folder, "trace-inline.jsonl")
    plain = runner.run("untraced", None, args.steps)
    traced = runner.run("json", ["--json", "--py-stacks", "-o", trace_json], args.steps)
    summary = runner.run("summary", ["--summary", "--py-stacks"], args.steps)
    plain_inline = runner.run("untraced-inline", None, args.steps, inline=True)
    inline = runner.run("json-inline", ["--json", "--py-stacks", "-o", inline_json], args.steps,
                        inline=True)
    for r in (plain, traced, summary, plain_inline, inline):
        report["runs"][r["name"]] = {k: r[k] for k in ("rc", "wall_s", "loop_lines",
                                                      "stderr_tail", "lost")}
        if r["rc"] != 0 or r["result"] is None:
            print("  run %s: exit %d, stderr: %s" % (r["name"], r["rc"],
                                                     " | ".join(r["stderr_tail"])))
    if plain["result"]:
        report["python"] = plain["result"]["python"]
        report["torch"] = plain["result"]["torch"]

    check("results identical traced and untraced",
          same_results(plain, traced) and same_results(plain, summary)
          and same_results(plain_inline, inline),
          "untraced %s; --json --py-stacks %s; --summary --py-stacks %s; inline backward "
          "untraced %s, traced %s" % (plain["loop_lines"], traced["loop_lines"],
                                      summary["loop_lines"], plain_inline["loop_lines"],
                                      inline["loop_lines"]))

    for label, run, path, scope in (("attribution", traced, trace_json, "main"),
                                    ("attribution, backward inline", inline, inline_json, "all")):
        if run["result"] is None or not os.path.exists(path):
            check("%s: trace" % label, False, "no trace (exit %d)" % run["rc"])
            continue
        calls = calls_of(read_events(path), run["result"]["pid"])
        found = attribute(calls, run["result"], script, lines, syncs)
        report[label] = found
        clock = found["clock"]
        check("%s: clock alignment" % label, clock["how"].startswith("anchors"),
              "%s, offset %+.1f us from the loop's own (anchors' bounds %s ns wide), lost %d"
              % (clock["how"], clock["offset_minus_own_us"],
                 "?" if clock["uncertainty_ns"] is None else "%.0f" % clock["uncertainty_ns"],
                 run["lost"]))
        for what in CATEGORIES:
            share = found["shares"][scope][what]
            pct = share["pct"]
            check("%s: %s on the right line (%s)" % (label, what, "loop's thread"
                                                    if scope == "main" else "all threads"),
                  pct is not None and pct >= TARGET and run["lost"] == 0,
                  "%s%% (%d of %d; wrong line %d, no frame of the loop %d; outside the marks %d)"
                  % (pct, share["right"], share["calls"], share["wrong"],
                     share["no_script_frame"], share["outside"]))
        if scope == "main":
            other = found["other_threads"]
            in_backward = sum(c.get("backward", 0) for c in other.values())
            total = sum(sum(c.values()) for c in other.values())
            attributed = sum(found["shares"]["other"][w]["right"] + found["shares"]["other"][w]
                             ["wrong"] for w in CATEGORIES)
            all_share = {w: found["shares"]["all"][w]["pct"] for w in CATEGORIES}
            check("%s: other threads' calls are backward's" % label,
                  total == 0 or (in_backward >= 0.99 * total and attributed == 0),
                  "%d calls on other threads (%s), %d inside backward() windows, %d with a frame "
                  "of the loop; all threads together: %s%% launches, %s%% allocations, %s%% "
                  "syncs on the right line" % (total, {w: sum(c.values()) for w, c in
                                                       other.items()}, in_backward, attributed,
                                               all_share["launch"], all_share["alloc"],
                                               all_share["sync"]))
        else:
            backward_line = lines["backward"]
            launches = found["attributed_lines"].get("launch", {})
            on_backward = sum(n for key, n in launches.items()
                              if key.startswith("%d " % backward_line))
            check("%s: backward's launches on the backward line" % label, on_backward > 0,
                  "%d launches attributed to line %d; launches by line: %s"
                  % (on_backward, backward_line, launches))

    if summary["rc"] == 0:
        found = summary_check(summary["stdout"], script, lines["item"])
        report["summary"] = found
        top = found.get("top_sync_row") or {}
        check("summary: the .item() line has the most sync time", found["ok"],
              "top row by Sync Time: %s (%s ns of %s ns in all rows); expected %s"
              % (top.get("where"), top.get("sync_ns"),
                 sum(r["sync_ns"] for r in found["rows"]), found.get("expected")))
    else:
        check("summary: the .item() line has the most sync time", False,
              "the --summary run exited %d" % summary["rc"])

    # cost per step: rounds of untraced, plain trace and --py-stacks, rotated
    modes = [("untraced", None), ("trace", ["-o", os.devnull]),
             ("trace+py", ["--py-stacks", "-o", os.devnull])]
    per: Dict[str, List[Dict[str, Optional[float]]]] = {m: [] for m, _ in modes}
    for round_no in range(args.rounds):
        order = modes[round_no % 3:] + modes[:round_no % 3]
        for mode, options in order:
            r = runner.run("cost-%s" % mode, options, args.cost_steps)
            per[mode].append(step_times(r["result"]))
            if r["rc"] != 0:
                print("  cost run %s: exit %d: %s" % (mode, r["rc"], " | ".join(r["stderr_tail"])))
        print("  cost round %d: %s" % (round_no + 1, "  ".join(
            "%s step %s us issue %s us" % (m, _fmt(per[m][-1]["step_us"]),
                                            _fmt(per[m][-1]["issue_us"])) for m, _ in modes)),
              flush=True)
    cost: Dict[str, Any] = {}
    for key in ("step_us", "issue_us"):
        cost[key] = {m: _median([r[key] for r in per[m]]) for m, _ in modes}
        cost[key]["py_stacks_added"] = _median([
            a[key] - b[key] for a, b in zip(per["trace+py"], per["trace"])
            if a[key] is not None and b[key] is not None])
    report["cost"] = {"per_round": per, "medians": cost, "steps": args.cost_steps,
                      "rounds": args.rounds}
    print("INFO cost per step (median of %d rounds, %d steps each, first %d left out): step "
          "untraced %s us, trace %s us, --py-stacks %s us (added %s us); issue (CPU side, "
          "before .item()) untraced %s, trace %s, --py-stacks %s us (added %s us)"
          % (args.rounds, args.cost_steps, WARMUP_STEPS,
             *(_fmt(cost["step_us"][k]) for k in ("untraced", "trace", "trace+py",
                                                  "py_stacks_added")),
             *(_fmt(cost["issue_us"][k]) for k in ("untraced", "trace", "trace+py",
                                                   "py_stacks_added"))), flush=True)

    for path in (trace_json, inline_json):  # (kept, smaller)
        if os.path.exists(path):
            with open(path, "rb") as raw, gzip.open(path + ".gz", "wb") as packed:
                shutil.copyfileobj(raw, packed)
            os.remove(path)
    report["passed"] = all(ok for _, ok, _ in checks)
    path = os.path.join(out, "py_stacks_check.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print("%s lines: %d of %d checks passed; details in %s"
          % ("PASS" if report["passed"] else "FAIL", sum(ok for _, ok, _ in checks),
             len(checks), path))
    return 0 if report["passed"] else 1


def _text(data) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def _median(values: List[Optional[float]]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else "%.1f" % value


def _wheel_libcudart() -> Optional[str]:
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia.cuda_runtime")
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = os.path.join(folder, "lib", "libcudart.so.12")
        if os.path.isfile(candidate):
            return candidate
    return None


if __name__ == "__main__":
    raise SystemExit(main())
