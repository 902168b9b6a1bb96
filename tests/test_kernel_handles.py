"""CUDA 13's nvcc code launches with a cudaKernel_t from __cudaGetKernel instead of the host
stub's address: the tracer learns handle → stub from that call and names the launch."""
import json
import subprocess
import sys

from fakecuda import build_fake_cuda


def test_a_launch_through_a_kernel_handle_is_named(root, cc, tmp_path):
    lib, prog = build_fake_cuda(cc)
    out = tmp_path / "t.jsonl"
    done = subprocess.run([sys.executable, "-m", "ebpf_cuda", "--json", "-o", str(out), "-p",
                           str(lib), "--", str(prog), "getkernel", "launchhandle:4:256",
                           "cudagetkernel", "launchhandle:2:32", "sleep:300"],
                          capture_output=True, text=True, timeout=60)
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
