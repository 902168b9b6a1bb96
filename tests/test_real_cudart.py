"""NVIDIA's own libcudart.so.12 (the nvidia-cuda-runtime-cu12 wheel), traced for real.

There is no GPU driver here, so every call returns 35 (cudaErrorInsufficientDriver); the
calls, their arguments and their results must still be traced exactly.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from fakecuda import SEED_FUNCTIONS, build_driver_prog, wheel_libcudart
from helpers import trace_command
from test_trace_e2e import _pairs, expected_args

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "cuda_calls.py"
INSUFFICIENT_DRIVER = 35
OPS = ("malloc:4000", "memcpy:4000:1", "launch:4,1,1:256,1,1", "getdevice", "setdevice:0",
       "streamcreate", "streamsync", "eventcreate", "eventrecord", "eventsync", "free")
EXAMPLE_FUNCTIONS = SEED_FUNCTIONS + ("cudaGetDeviceCount", "cudaEventDestroy",
                                      "cudaStreamDestroy")


@pytest.fixture(scope="module")
def real_lib():
    lib = wheel_libcudart()
    if lib is None:
        pytest.skip("nvidia-cuda-runtime-cu12 is not installed")
    return lib


@pytest.fixture(scope="module")
def real_prog(cc, real_lib):
    (cc.outdir / "realcuda").mkdir(exist_ok=True)
    return build_driver_prog(cc, real_lib, "realcuda/cuda_driver_prog")


def _runpath(path: Path) -> str:
    with open(path, "rb") as f:
        dynamic = ELFFile(f).get_section_by_name(".dynamic")
        for tag in dynamic.iter_tags():
            if tag.entry.d_tag in ("DT_RUNPATH", "DT_RPATH"):
                return tag.runpath if tag.entry.d_tag == "DT_RUNPATH" else tag.rpath
    return ""


def test_driver_program_on_real_cudart_found_through_runpath(root, real_lib, real_prog):
    folder = str(Path(real_lib).resolve().parent)
    assert folder in _runpath(real_prog).split(":")
    assert folder not in os.environ.get("LD_LIBRARY_PATH", "")
    # no library given: the tracer reads the program's dynamic section to find it
    events, calls, tracer = trace_command([real_prog, *OPS], functions=list(SEED_FUNCTIONS))
    assert {a.path for a in tracer.attachments} == {os.path.realpath(real_lib)}
    assert tracer.exit_status == 0
    assert len(calls) == len(OPS)
    assert all(call.ret == INSUFFICIENT_DRIVER for call in calls), calls
    pairs = _pairs(events)
    assert [enter.api for enter, _ in pairs] == [call.fn for call in calls]
    for (enter, exit_), call in zip(pairs, calls):
        assert enter.args == expected_args(call), call
        assert (exit_.ret, exit_.ret_name) == (INSUFFICIENT_DRIVER,
                                               "cudaErrorInsufficientDriver")
        assert exit_.outs == {} and exit_.duration_ns > 0  # failed: no out-parameter read
        assert enter.pid == enter.tid == tracer.child_pid
    by_api = {enter.api: enter for enter, _ in pairs}
    assert by_api["cudaMalloc"].args == {"size": 4000}
    assert by_api["cudaMemcpy"].args["kind"] == "HostToDevice"
    assert by_api["cudaMemcpy"].args["size"] == 4000
    assert by_api["cudaSetDevice"].args == {"device": 0}
    launch = by_api["cudaLaunchKernel"].args
    assert (launch["grid"], launch["block"], launch["smem"], launch["stream"]) == (
        (4, 1, 1), (256, 1, 1), 0, 0)


def test_cuda_calls_example_under_the_command(root, real_lib, tmp_path):
    if not EXAMPLE.is_file():
        pytest.skip("examples/cuda_calls.py is not there")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # JSON to a file: on a shared stdout, the example's own writes may land inside a batch
    # of JSON lines bigger than PIPE_BUF
    trace = tmp_path / "trace.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "ebpf_cuda", "--json", "-o", str(trace),
         "--functions", ",".join(EXAMPLE_FUNCTIONS), "--", sys.executable, str(EXAMPLE)],
        capture_output=True, text=True, timeout=60, env=env, cwd=str(REPO))
    assert done.returncode == 0, done.stderr
    assert os.path.realpath(real_lib) in done.stderr.splitlines()[0]
    pid = int(re.search(r"\(pid (\d+)\)", done.stdout).group(1))
    called = [m.group(1) for m in re.finditer(r"^(cuda\w+)\(.*-> (\d+)", done.stdout, re.M)]
    assert len(called) == 15
    assert not any(line.startswith("{") for line in done.stdout.splitlines())
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    enters = [e for e in events if e["phase"] == "enter"]
    exits = [e for e in events if e["phase"] == "exit"]
    assert [e["api"] for e in enters] == [e["api"] for e in exits] == called
    assert {e["pid"] for e in events} == {e["tid"] for e in events} == {pid}
    assert all(e["ret"] == INSUFFICIENT_DRIVER and e["ret_name"] == "cudaErrorInsufficientDriver"
               and e["duration_ns"] > 0 for e in exits)
    args = [(e["api"], e["args"]) for e in enters]
    malloc = [a for api, a in args if api == "cudaMalloc"]
    memcpy = [a for api, a in args if api == "cudaMemcpy"]
    launch = [a for api, a in args if api == "cudaLaunchKernel"]
    assert malloc == [{"size": 4000}]
    assert [(m["size"], m["kind"]) for m in memcpy] == [(4000, "HostToDevice"),
                                                         (4000, "DeviceToHost")]
    assert memcpy[0]["src"] == memcpy[1]["dst"] != 0  # the same host buffer both ways
    assert [a for api, a in args if api == "cudaSetDevice"] == [{"device": 0}]
    assert [a for api, a in args if api == "cudaGetDevice"] == [{}]
    assert [(a["func"], a["grid"], a["block"], a["smem"]) for a in launch] == [
        (0, [4, 1, 1], [256, 1, 1], 0)]
