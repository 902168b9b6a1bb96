"""`--pprof-out`: the profile a real trace (and the monitor) writes, read back by
`go tool pprof -raw` (Debian's golang-go), has the right totals per sample type and the
callers of the memory calls (--stacks); the protobuf encoding itself (pure logic)."""
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter

import pytest

from ebpf_cuda.bpf import features
from ebpf_cuda.output import pprof
from helpers import run_cli
from monitor_support import AFTER, BEFORE, KERNEL, Held, MonitorCli

GO = shutil.which("go")
need_go = pytest.mark.skipif(GO is None, reason="go is not installed (apt-get install -y "
                             "golang-go; .ci/run installs it): nothing reads the profile")


def read_raw(path, tmp_path) -> dict:
    """`go tool pprof -raw PATH`: {"types": [...], "samples": [(values, [function names],
    labels text)], "totals": {type: sum}}."""
    done = subprocess.run([GO, "tool", "pprof", "-raw", str(path)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, HOME=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    head, rest = text.split("Samples:\n", 1)
    sample_text, locations = rest.split("Locations\n", 1)
    names = {}
    for line in locations.split("Mappings\n", 1)[0].splitlines():
        match = re.match(r"\s*(\d+): 0x[0-9a-f]+ M=\d+ (.+) (\S+):\d+ s=\d+$", line)
        if match:
            names[int(match[1])] = match[2]
    lines = sample_text.splitlines()
    types = [t.split("/")[0] for t in lines[0].split()]
    samples = []
    for line in lines[1:]:
        match = re.match(r"\s*([\d ]+): ([\d ]+)$", line)
        if match:
            values = [int(v) for v in match[1].split()]
            samples.append([values, [names[int(i)] for i in match[2].split()], ""])
        elif samples:
            samples[-1][2] += line.strip() + " "
    totals = {t: sum(s[0][i] for s in samples) for i, t in enumerate(types)}
    return {"types": [t.replace("[dflt]", "") for t in types], "samples": samples,
            "totals": totals}


def by_leaf(raw: dict, kind: str) -> Counter:
    index = raw["types"].index(kind)
    found: Counter = Counter()
    for values, frames, _ in raw["samples"]:
        found[frames[0]] += values[index]
    return +found  # (the functions with some of this type)


@need_go
@pytest.mark.kernel
def test_a_trace_profile_has_its_calls_time_launches_and_bytes(tmp_path, prog, lib):
    profile, events = tmp_path / "cuda.pb.gz", tmp_path / "events.jsonl"
    done = run_cli("--pprof-out", profile, "--stacks", "--json", "-o", events, "-p", lib,
                   "--", prog, "setdevice:0", "sleep:200", "loop:5:malloc:4096",
                   "memcpy:1000:1", "memcpy:24:2", "loop:3:launch:4,1,1:256,1,1",
                   "launch:1,1,1:2000,1,1", "malloc:0x20000000000", "free")
    assert done.returncode == 0, done.stderr
    exits = [e for e in map(json.loads, events.read_text().splitlines()) if e["phase"] == "exit"]
    raw = read_raw(profile, tmp_path)
    assert raw["types"] == ["calls", "api_time", "launches", "alloc_space", "copy_space"]
    assert raw["totals"] == {"calls": 14, "api_time": sum(e["duration_ns"] for e in exits),
                             "launches": 3, "alloc_space": 5 * 4096, "copy_space": 1024}
    assert by_leaf(raw, "calls") == {"cudaSetDevice": 1, "cudaMalloc": 6, "cudaMemcpy": 2,
                                     "cudaLaunchKernel": 1, KERNEL: 3, "cudaFree": 1}
    # --stacks: the memory calls' callers, symbolized (the program's own functions)
    malloc = [frames for _, frames, _ in raw["samples"] if frames[0] == "cudaMalloc"]
    assert all(frames[1:3] == ["do_alloc", "repeat_calls"] for frames in malloc[:1])
    assert any("main" in frames for frames in malloc)
    assert all("pid:" in labels and "comm:[cuda_driver_pro]" in labels
               for _, _, labels in raw["samples"])


@need_go
@pytest.mark.kernel
@pytest.mark.parametrize("sampling", ["1", "64"])
def test_the_monitor_profile_counts_every_process_of_the_run(tmp_path, prog, lib, sampling):
    """Every return taken, and launch returns sampled (the default; where the kernel has
    uprobe sessions launches are counted at entry, AFTER's failed one too)."""
    attempts = sampling != "1" and features.session_is_return_id() is not None
    profile = tmp_path / "monitor.pb.gz"
    cli = MonitorCli("-p", lib, "--pprof-out", profile, "--return-sampling", sampling)
    try:
        Held(prog, BEFORE).go().wait()
        Held(prog, AFTER).go().wait()
        time.sleep(1.5)  # (the first exited process is dropped by then: still counted)
    finally:
        assert cli.stop(signal.SIGTERM) == 0, cli.lines
    raw = read_raw(profile, tmp_path)
    calls = by_leaf(raw, "calls")
    assert (calls["cudaMalloc"], calls["cudaSetDevice"], calls["cudaLaunchKernel"]) == (51, 3, 9)
    assert raw["totals"]["launches"] == 8 + attempts
    assert by_leaf(raw, "launches") == {KERNEL: 8 + attempts}
    assert raw["totals"]["alloc_space"] == 40 * 4096 + 1000
    assert raw["totals"]["copy_space"] == 2000 + 300 + 50
    assert raw["totals"]["api_time"] > 0


def test_varints_and_fields():
    assert pprof.varint(0) == b"\x00" and pprof.varint(1) == b"\x01"
    assert pprof.varint(300) == b"\xac\x02"
    assert pprof.varint(-1) == b"\xff" * 9 + b"\x01"  # int64 -1: ten bytes
    assert pprof.number_field(1, 0) == b""  # proto3: zero is left out
    assert pprof.bytes_field(6, b"ab") == b"\x32\x02ab"
    assert pprof.packed_field(2, [1, 300]) == b"\x12\x03\x01\xac\x02"


def test_a_profile_is_gzipped_with_the_empty_string_first():
    import gzip

    profile = pprof.Profile()
    profile.add([("cudaMalloc", "[runtime]")], [1, 2, 0, 4096, 0])
    profile.add([("cudaMalloc", "[runtime]")], [1, 3, 0, 4096, 0])
    assert profile.total(pprof.ALLOC) == 8192
    data = gzip.decompress(profile.encode(time_ns=5, duration_ns=7))
    # string_table (field 6) starts with ""; the sample's values are summed
    assert b"\x32\x00" in data and pprof.packed_field(2, [2, 5, 0, 8192, 0]) in data
