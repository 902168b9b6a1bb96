"""`--step-at` on a native function, and the native region of the loop findings, under
`--stacks` without Python stacks. Real probes on the stand-in libcudart with its simulated
device, tracing tests/native/step_native.c: set-up calls outside train_step, then STEPS
calls of train_step (a copy and a sync, whose stacks are recorded, and LAUNCHES launches,
which record none). The saved trace analysed offline gives the same records."""
import json
import re
import subprocess
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from helpers import cli_env, need_root, run_cli

pytestmark = pytest.mark.kernel

STEPS = 7  # (step_native.c's)


@pytest.fixture(scope="module")
def program(cc, lib) -> Path:
    folder = str(Path(lib).resolve().parent)
    return cc.executable("step_native.c", "fakecuda/step_native",
                         extra=["-L", folder, "-l:" + Path(lib).name, "-Wl,-rpath," + folder])


def size_of(program: Path, function: str) -> int:
    """The function's size, as nm reads the program's symbol table."""
    for line in subprocess.run(["nm", "-S", str(program)], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tT" and parts[3] == function:
            return int(parts[1], 16)
    raise AssertionError("%s not in %s" % (function, program))


def offsets(region: str, program: Path, function: str) -> Tuple[int, int]:
    """`FUNCTION+0xA-0xB (PROGRAM)` (or `+0xA`): (A, B), return offsets inside it."""
    match = re.fullmatch(r"(\w+)\+0x([0-9a-f]+)(?:-0x([0-9a-f]+))? \((.+)\)", region)
    assert match is not None, region
    assert match.group(1) == function and match.group(4) == program.name
    first = int(match.group(2), 16)
    last = int(match.group(3) or match.group(2), 16)
    assert 0 < first <= last <= size_of(program, function)
    return first, last


def trace(tmp_path: Path, lib: Path, program: Path, launches: int, *options: str,
          text: bool = False, **env: str) -> List[Dict]:
    """The live records of `--stacks --analyze --json [OPTIONS] -- PROGRAM LAUNCHES`; the
    saved trace analysed offline with the same options gives the same records (and, with
    `text`, the offline text report is returned as a last record, {"text": ...})."""
    need_root()
    saved = tmp_path / "run.ebpfcuda"
    live = run_cli("--stacks", "--analyze", "--json", "-o", tmp_path / "events.jsonl",
                   "--save", saved, "-p", lib, *options, "--", program, str(launches),
                   env=cli_env(**env), timeout=180)
    assert live.returncode == 0, live.stderr
    offline = run_cli("analyze", "--json", saved, *options)
    assert offline.returncode == 0, offline.stderr
    records = [json.loads(line) for line in live.stdout.splitlines() if line.startswith("{")]
    assert records == [json.loads(line) for line in offline.stdout.splitlines() if line]
    if text:
        report = run_cli("analyze", saved, *options)
        assert report.returncode == 0, report.stderr
        records.append({"text": report.stdout})
    return records


def of_type(records: List[Dict], kind: str) -> List[Dict]:
    return [r for r in records if r.get("type") == kind]


def test_step_at_a_native_function_counts_its_calls(lib, program, tmp_path):
    records = trace(tmp_path, lib, program, 2, "--step-at", "train_step",
                    FAKECUDA_DEVICE_US="5000")
    loop, = of_type(records, "steps")
    assert loop["steps"] == STEPS and loop["found_by"] == "--step-at train_step"
    assert loop["modes"] == ["eager"] * STEPS and loop["launches_p50"] == 2
    # the loop's region: the return offsets of the copy and the sync in train_step
    first, last = offsets(loop["where"], program, "train_step")
    assert first < last
    assert of_type(records, "no_steps") == []
    # the host waits for the simulated device in every step, in train_step itself
    sync, = of_type(records, "finding")
    assert sync["rule"] == "sync-in-step" and sync["evidence"]["calls"] == STEPS - 1
    assert sync["where"]["native"].startswith("train_step+0x%x " % last)


def test_without_step_at_the_set_up_passes_for_a_step(lib, program, tmp_path):
    """What --step-at is for: the set-up's copy of the batch's size and launch look like a
    first step to the repeating sequence (more than EDGE_STEP_MIN_SHARE of a step's work),
    so it finds one step more; a name that is only a prefix of train_step matches nothing."""
    records = trace(tmp_path, lib, program, 2, FAKECUDA_DEVICE_US="5000")
    loop, = of_type(records, "steps")
    assert loop["steps"] == STEPS + 1 and loop["found_by"].startswith("a repeating sequence")
    offsets(loop["where"], program, "train_step")  # (the steady steps': in train_step)
    records = trace(tmp_path, lib, program, 2, "--step-at", "train", FAKECUDA_DEVICE_US="5000")
    assert of_type(records, "steps") == [] and len(of_type(records, "no_steps")) == 1


def test_step_at_matching_nothing_says_so_in_one_line(lib, program, tmp_path):
    records = trace(tmp_path, lib, program, 2, "--step-at", "no_such_function", text=True,
                    FAKECUDA_DEVICE_US="5000")
    assert of_type(records, "steps") == []
    none, = of_type(records, "no_steps")
    assert none["step_at"] == "no_such_function"
    assert none["reason"].startswith("--step-at no_such_function matched nothing: ")
    lines = [line for line in records[-1]["text"].splitlines() if "Steps" in line]
    assert lines == [" Steps: none: " + none["reason"]]
    html = tmp_path / "report.html"  # (the HTML report's analysis says the same)
    report = run_cli("analyze", "--report", html, "--step-at", "no_such_function",
                     tmp_path / "run.ebpfcuda")
    assert report.returncode == 0, report.stderr
    assert "<p>Steps: none: %s</p>" % none["reason"] in html.read_text()


@pytest.mark.parametrize("options", [(), ("--step-at", "train_step")])
def test_launch_bound_names_the_native_region(lib, program, tmp_path, options):
    # each launch spins 30 us on the host and queues 1 us of device time: the GPU keeps up
    records = trace(tmp_path, lib, program, 30, *options, FAKECUDA_DEVICE_US="1",
                    FAKECUDA_LAUNCH_US="30")
    loop, = of_type(records, "steps")
    assert loop["steps"] == STEPS and loop["launches_p50"] == 30
    finding, = of_type(records, "finding")
    assert finding["rule"] == "launch-bound"
    assert finding["evidence"]["launches_per_step"] == 30
    assert finding["where"]["python"] is None
    assert offsets(finding["where"]["native"], program, "train_step") \
        == offsets(loop["where"], program, "train_step")
