"""`--analyze --stacks` without Python stacks: each finding's `where.native` names the C
function that made the call (its native caller: the innermost frame outside the CUDA
libraries), and graph replays are attributed to the function that began their capture.
Real probes on the stand-in libcudart with its simulated device, tracing
tests/native/analyze_native.c; the saved trace analysed offline gives the same records."""
import json
import re
import subprocess
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from helpers import cli_env, need_root, run_cli

pytestmark = pytest.mark.kernel

STEPS = 6  # (analyze_native.c's)
DEVICE_US = 5000


@pytest.fixture(scope="module")
def native(cc, lib) -> Path:
    folder = str(Path(lib).resolve().parent)
    return cc.executable("analyze_native.c", "fakecuda/analyze_native",
                         extra=["-L", folder, "-l:" + Path(lib).name, "-Wl,-rpath," + folder])


def functions(program: Path) -> Dict[str, Tuple[int, int]]:
    """name -> (address, size) of the program's functions, as nm reads its symbol table."""
    found = {}
    for line in subprocess.run(["nm", "-S", str(program)], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tT":
            found[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
    return found


def assert_names(site: str, program: Path, function: str) -> None:
    """`FUNCTION+0xOFF (PROGRAM)`, its offset a return address inside that function."""
    match = re.fullmatch(r"(\w+)\+0x([0-9a-f]+) \((.+)\)", site)
    assert match is not None, site
    assert match.group(1) == function and match.group(3) == program.name
    _, size = functions(program)[function]
    assert 0 < int(match.group(2), 16) <= size


def trace(tmp_path: Path, lib: Path, program: Path, scenario: str) -> List[dict]:
    """The live records of one scenario under --stacks --analyze; offline: the same."""
    need_root()
    saved = tmp_path / "run.ebpfcuda"
    live = run_cli("--stacks", "--analyze", "--json", "-o", tmp_path / "events.jsonl",
                   "--save", saved, "-p", lib, "--", program, scenario,
                   env=cli_env(FAKECUDA_DEVICE_US=str(DEVICE_US)), timeout=180)
    assert live.returncode == 0, live.stderr
    offline = run_cli("analyze", "--json", saved)
    assert offline.returncode == 0, offline.stderr
    records = [json.loads(line) for line in live.stdout.splitlines() if line.startswith("{")]
    assert records == [json.loads(line) for line in offline.stdout.splitlines() if line]
    return records


def findings(records: List[dict]) -> List[dict]:
    return [r for r in records if r["type"] == "finding"]


def test_sync_in_step_names_the_c_function(lib, native, tmp_path):
    records = trace(tmp_path, lib, native, "sync")
    loop, = [r for r in records if r["type"] == "steps"]
    assert loop["steps"] == STEPS
    finding, = findings(records)
    assert finding["rule"] == "sync-in-step" and finding["where"]["python"] is None
    assert finding["where"]["api"] == "cudaStreamSynchronize"
    assert finding["evidence"]["calls"] == STEPS - 1
    assert_names(finding["where"]["native"], native, "wait_for_gpu")


def test_pageable_copy_names_the_c_function(lib, native, tmp_path):
    records = trace(tmp_path, lib, native, "pageable")
    finding, = findings(records)
    assert finding["rule"] == "pageable-copy" and finding["where"]["api"] == "cudaMemcpyAsync"
    assert finding["evidence"]["calls"] == STEPS and finding["evidence"]["asynchronous"]
    assert_names(finding["where"]["native"], native, "stage_batch")


def test_graph_replays_attributed_to_the_capturing_function(lib, native, tmp_path):
    records = trace(tmp_path, lib, native, "graphs")
    loop, = [r for r in records if r["type"] == "steps"]
    assert loop["steps"] == STEPS and loop["modes"] == ["graph"] * STEPS
    replays, = [r for r in records if r["type"] == "graph_replays"]
    assert replays["replays"] == STEPS
    assert_names(replays["captured_at"], native, "capture_forward")
    assert findings(records) == []


def test_alloc_churn_names_the_c_functions_that_allocate_and_free(lib, native, tmp_path):
    records = trace(tmp_path, lib, native, "churn")
    finding, = findings(records)
    assert finding["rule"] == "alloc-churn"
    assert (finding["evidence"]["allocations"], finding["evidence"]["frees"]) == (STEPS - 1,
                                                                                 STEPS - 1)
    alloc, free = finding["where"]["sites"]  # (sorted: scratch_alloc's first)
    assert_names(alloc, native, "scratch_alloc")
    assert_names(free, native, "scratch_free")


def test_default_stream_memset_names_the_c_function(lib, native, tmp_path):
    records = trace(tmp_path, lib, native, "default")
    finding, = findings(records)
    assert finding["rule"] == "default-stream-work" and finding["where"]["python"] is None
    assert finding["evidence"] == {"calls": STEPS, "bytes": STEPS << 20}
    assert_names(finding["where"]["native"], native, "clear_on_default")


def test_ignored_error_names_the_c_function(lib, native, tmp_path):
    records = trace(tmp_path, lib, native, "error")
    finding, = findings(records)
    assert finding["rule"] == "ignored-error"
    assert finding["evidence"] == {"calls": STEPS, "error": "cudaErrorInvalidMemcpyDirection",
                                   "ret": 21}
    assert_names(finding["where"]["native"], native, "copy_result")
