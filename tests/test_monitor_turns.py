"""scripts/gpu/monitor_turns.py, the GPU host's cost measurement, run here on the stand-in
runtime (`--smoke`): three processes on their own copies of the library, real probes (the
monitor on one copy, bare counting entry probes on another), turns in rotated order; the
checks that would catch probes in the wrong place, and the statistics (pure logic)."""
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts" / "gpu"
sys.path.insert(0, str(SCRIPTS))
import monitor_turns  # noqa: E402


@pytest.fixture(scope="module")
def pyz(tmp_path_factory):
    out = tmp_path_factory.mktemp("turns") / "ebpf-cuda.pyz"
    subprocess.run([sys.executable, "-m", "ebpf_cuda.bundle", "-o", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    return out


@pytest.mark.kernel
@pytest.mark.parametrize("paused, second", [(False, False), (True, False), (False, True)],
                         ids=["monitor-running", "monitor-paused", "two-builds"])
def test_the_modes_take_turns_on_their_own_copies(root, lib, pyz, tmp_path, paused, second):
    """(two-builds: --pyz-b, a second monitor on copies of its own in the same turns)"""
    rounds, ops = 60, 100
    source = tmp_path / "libcudart.so.12"
    shutil.copyfile(str(lib), str(source))
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, str(SCRIPTS / "monitor_turns.py"), "--pyz", str(pyz),
         "--smoke", str(source), "--rounds", str(rounds), "--ops", str(ops),
         "--copies", str(tmp_path / "copies")] + (["--pause-monitor"] if paused else [])
        + (["--pyz-b", str(pyz)] if second else []),
        env=dict(os.environ, OUT=str(out)), stdout=subprocess.PIPE, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-2000:]
    records = [json.loads(line) for line in (out / "monitor_turns.jsonl").read_text().splitlines()]
    (result,) = [r for r in records if r["part"] == "turns"]
    assert result["problems"] == []
    assert result["monitor_paused"] is paused  # (a stopped reader: the counts are the kernel's)
    made = 50 + rounds * ops  # (the warm-up, then one rep a turn)
    modes = ["untraced", "bare-entry", "monitor"] + (["monitor-b"] if second else [])
    assert result["made"] == dict.fromkeys(modes, made)
    assert result["monitor_counted_launches"] == made  # (each child's launches exactly)
    if second:
        assert result["monitor_b_counted_launches"] == made
        assert result["monitor_b_exit_status"] == 0
        assert result["monitor/monitor-b"]["rounds"] == rounds
        assert result["per_hit"]["monitor_b_ns"] is not None
    assert result["monitor_calls_by_api"] == {
        'api="cudaLaunchKernel",layer="runtime"': made}
    assert result["monitor_errors_by_api"] == {}
    assert result["bare_hits"] == made  # (the stand-in's launch enters one probed function)
    for mode, child in result["children"].items():
        assert child["maps"] == [str(tmp_path / "copies" / mode / "libcudart.so.12")]
    assert all(len(times) == rounds for times in result["times"].values())
    assert result["monitor/bare-entry"]["rounds"] == rounds
    assert result["bare-entry/untraced"]["geomean"] > 1  # (a trap costs; it shows)
    assert result["per_hit"]["hits_per_step"] == 1 and result["per_hit"]["bare_ns"] > 0
    assert not (tmp_path / "copies").exists()  # (removed at the end)


def _result(maps_of_monitor, counted, made=1000, bare_hits=1200, smoke=True):
    copies = {m: ["/c/%s/libcudart.so.12" % m] for m in monitor_turns.MODES}
    children = {m: {"pid": 10 + i, "maps": copies[m]}
                for i, m in enumerate(monitor_turns.MODES)}
    children["monitor"]["maps"] = maps_of_monitor
    result = {"workload": "tiny", "smoke": smoke, "children": children,
              "made": {m: made for m in monitor_turns.MODES}}
    samples = {("ebpf_cuda_kernel_launches_total", 'pid="12",kernel="k"'): counted}
    return result, samples, bare_hits, copies


def test_the_checks_catch_probes_out_of_place():
    result, samples, hits, copies = _result(["/c/monitor/libcudart.so.12"], 1000)
    assert monitor_turns.check_probes(result, samples, hits, copies) == []
    # the monitor child loaded the untraced copy: its launches go uncounted
    result, samples, hits, copies = _result(["/c/untraced/libcudart.so.12"], 0)
    problems = monitor_turns.check_probes(result, samples, hits, copies)
    assert any("monitor child maps" in p for p in problems)
    assert any("counted 0 launches" in p for p in problems)
    # the bare probes missed their child; a launch counted for another process
    result, samples, hits, copies = _result(["/c/monitor/libcudart.so.12"], 1000,
                                            bare_hits=10)
    samples[("ebpf_cuda_kernel_launches_total", 'pid="99",kernel="k"')] = 5
    problems = monitor_turns.check_probes(result, samples, hits, copies)
    assert any("bare probes hit 10 times" in p for p in problems)
    assert any('pid="99"' in p for p in problems)
    # PyTorch's tiny child: one launch more than its ops (torch.zeros fills)
    result, samples, hits, copies = _result(["/c/monitor/libcudart.so.12"], 1001,
                                            smoke=False)
    assert monitor_turns.check_probes(result, samples, hits, copies) == []


def test_the_bootstrap_interval_holds_the_geometric_mean():
    ratios = [1.0, 1.02, 0.98, 1.01, 0.99] * 40
    got = monitor_turns.bootstrap(ratios)
    expected = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    assert got["geomean"] == pytest.approx(expected)
    assert got["ci95"][0] < expected < got["ci95"][1]
    assert got["ci95"][1] - got["ci95"][0] < 0.01 and got["median"] == 1.0
    assert got["rounds"] == 200


def test_the_cost_of_a_probe_hit_is_the_step_s_extra_time_over_its_hits():
    # (D31 call 1: the MLP step 1,203.1 us untraced, 1,256.3 with the bare probes, 1,262.5
    # with the monitor; 768,383 bare hits over 24,050 steps)
    result = {"bare_hits": 768383, "made": {"bare-entry": 24050},
              "mean": {"untraced": 1203.1, "bare-entry": 1256.3, "monitor": 1262.5}}
    got = monitor_turns.trap_costs(result)
    assert got["hits_per_step"] == pytest.approx(31.95, abs=0.01)
    assert got["bare_ns"] == pytest.approx(1665, abs=1)  # (1e3 * 53.2 / 31.95)
    assert got["monitor_ns"] == pytest.approx(1859, abs=1)
    result["bare_hits"] = 0
    assert monitor_turns.trap_costs(result)["bare_ns"] is None
