"""CUDA 13's nvcc code launches with a cudaKernel_t from __cudaGetKernel instead of the host
stub's address: the tracer learns handle → stub from that call and names the launch."""
import json

import pytest

from fakecuda import build_fake_cuda
from helpers import run_cli

pytestmark = pytest.mark.kernel


def test_a_launch_through_a_kernel_handle_is_named(root, cc, tmp_path):
    lib, prog = build_fake_cuda(cc)
    out = tmp_path / "t.jsonl"
    done = run_cli("--json", "-o", out, "-p", lib, "--", prog, "getkernel", "launchhandle:4:256",
                   "cudagetkernel", "launchhandle:2:32", "sleep:300")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in out.read_text().splitlines()]
    kernels = [e["kernel"] for e in events if e["api"] == "cudaLaunchKernel"
               and e["phase"] == "exit"]
    handles = [e["kernel"] for e in events if e["api"] in ("__cudaGetKernel", "cudaGetKernel")
               and e["phase"] == "exit"]
    launched = [e["args"]["func"] for e in events if e["api"] == "cudaLaunchKernel"
                and e["phase"] == "exit"]
    assert handles == launched == [0x9000, 0x9001]
    assert kernels == ["vec_add_kernel", "vec_add_kernel"]
