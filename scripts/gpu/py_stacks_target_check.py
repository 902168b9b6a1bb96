"""On the GPU host: tests/pystacks/target.py (nested functions, a method, a generator called
from C, a lambda, a multi-line expression, a thread, an asyncio task, recursion) calling
this host's libcudart under `--py-stacks`; every call's py_stack must equal the stack the
interpreter itself recorded (as tests/test_py_stacks_e2e.py checks on the CI machine).

    python3 scripts/gpu/py_stacks_target_check.py LIBCUDART OUTDIR
"""
import json
import os
import subprocess
import sys

lib, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
truth, events = os.path.join(out, "truth.json"), os.path.join(out, "target_events.json")
run = subprocess.run([sys.executable, "-m", "ebpf_cuda", "--json", "-o", events, "--py-stacks",
                      "--functions", "cudaGetDeviceCount", "--", sys.executable,
                      "tests/pystacks/target.py", lib, truth], capture_output=True, text=True)
print("tracer rc", run.returncode, run.stderr.strip()[-300:])
exits = [e for e in map(json.loads, open(events)) if e["phase"] == "exit"]
calls = json.load(open(truth))
good = 0
for tid in {c["tid"] for c in calls}:
    seen = [e for e in exits if e["tid"] == tid]
    for event, call in zip(seen, [c for c in calls if c["tid"] == tid]):
        got = [[f["file"], f["line"], f["function"]] for f in event.get("py_stack", [])]
        good += got == call["stack"]
        if got != call["stack"]:
            print("DIFF", got, call["stack"])
print("%s target: %d of %d calls' py_stack equal the interpreter's own stack (%d events)"
      % ("PASS" if good == len(calls) == len(exits) else "FAIL", good, len(calls), len(exits)))
