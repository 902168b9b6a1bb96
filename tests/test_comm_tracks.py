"""The timeline's communicator tracks (output/chrome_trace.py), for real: stand-in ranks
(tests/native/nccl_rank.c on tests/native/fakenccl.c) started by one command under one
tracer, `--trace-out` parsed back exactly."""
import json
import re

import pytest

from ebpf_cuda.output.chrome_trace import COMM_TRACK_BASE
from fakenccl import build_fake_nccl, id_hash, unique_id
from helpers import cli_env, run_cli

pytestmark = pytest.mark.kernel

SEED = 33
ID = id_hash(unique_id(SEED))
OPS = {0: ["ar:64:7:0", "gs", "bc:32:2:1", "ge", "ar:16:7:0"], 1: ["ar:64:7:0", "gs",
                                                                    "bc:32:2:1", "ge"]}


@pytest.fixture(scope="module")
def nccl(cc):
    return build_fake_nccl(cc)


def _trace(nccl, tmp_path, script, *extra):
    meet = tmp_path / "meet"
    meet.mkdir(exist_ok=True)
    out = tmp_path / "t.json"
    done = run_cli("--api", "nccl", "-p", nccl[0], "--trace-out", out, *extra, "--",
                   "sh", "-c", script, nccl[1],
                   env=cli_env(FAKENCCL_RENDEZVOUS=str(meet)), timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text()), done.stdout


def _named(trace, kind, pid):
    return {e["tid"]: e["args"]["name"] for e in trace
            if e["ph"] == "M" and e["name"] == kind and e["pid"] == pid}


def test_each_communicator_has_a_track_per_rank_beside_the_threads(nccl, tmp_path):
    script = " & ".join('"$0" 2 %d %d %s' % (r, SEED, " ".join(OPS[r])) for r in (0, 1)) \
        + " & wait"
    trace, stdout = _trace(nccl, tmp_path, script)
    handles = {int(m.group(2)): int(m.group(1), 16) for m in re.finditer(
        r"^init ret=0 out=(0x[0-9a-f]+) fn=ncclCommInitRank nranks=2 rank=(\d)$", stdout, re.M)}
    assert sorted(handles) == [0, 1]
    # one process for the communicator, named by its id; one thread in it per rank
    comm_pids = [e["pid"] for e in trace if e["ph"] == "M" and e["name"] == "process_name"
                 and e["args"]["name"].startswith("NCCL comm")]
    assert len(comm_pids) == 1 and comm_pids[0] >= COMM_TRACK_BASE
    track = comm_pids[0]
    assert _named(trace, "process_name", track) == {0: "NCCL comm %s" % ID}
    threads = _named(trace, "thread_name", track)
    assert sorted(threads.values()) == ["NCCL comm %s (rank 0/2)" % ID,
                                        "NCCL comm %s (rank 1/2)" % ID]
    by_rank = {int(re.search(r"rank (\d)/", name).group(1)): tid for tid, name in threads.items()}
    real = [e for e in trace if e["ph"] == "X" and e["pid"] < COMM_TRACK_BASE]
    for rank, tid in by_rank.items():
        slices = [e for e in trace if e["pid"] == track and e["tid"] == tid and e["ph"] != "M"]
        colls = [op for op in OPS[rank] if op not in ("gs", "ge")]
        names = ["ncclAllReduce", "ncclBroadcast", "ncclAllReduce"][:len(colls)]
        assert [(e["name"], e["ph"], e["cat"]) for e in slices] == \
            [("ncclCommInitRank", "X", "nccl comm")] + \
            [("%s #%d" % (n, i + 1), "X", "nccl comm") for i, n in enumerate(names)]
        assert all(e["args"]["comm_id"] == ID and e["args"]["rank"] == rank
                   and e["args"]["nranks"] == 2 for e in slices)
        assert slices[0]["args"]["comm"] == "0x%x" % handles[rank]  # (the handle it made)
        assert [e["args"]["seq"] for e in slices[1:]] == list(range(1, len(colls) + 1))
        assert slices[2]["args"]["count"] == 32 and slices[2]["args"]["root"] == 1
        # each is also on its thread's track: the same call, the same time span
        pid = next(e["pid"] for e in real if e["args"].get("rank") == rank)
        mine = [e for e in real if e["pid"] == pid]
        assert [e["name"] for e in mine] == ["ncclCommInitRank"] + \
            ["ncclGroupStart" if op == "gs" else "ncclGroupEnd" if op == "ge" else n
             for op, n in zip(OPS[rank], ["ncclAllReduce", None, "ncclBroadcast", None,
                                          "ncclAllReduce"])]
        nccl_mine = [e for e in mine if not e["name"].startswith("ncclGroup")]
        assert [(e["ts"], e["dur"], e["tid"] == pid) for e in nccl_mine] == \
            [(e["ts"], e["dur"], True) for e in slices]
        assert all(e["cat"] != "nccl comm" for e in mine)


def test_a_communicator_without_an_id_is_tracked_by_its_handle(nccl, tmp_path):
    """-r: no return values, so no communicator is known (no id, no rank); the collectives'
    entries are markers on a track of the handle and its process."""
    trace, stdout = _trace(nccl, tmp_path, '"$0" 1 0 %d ar:4:7:0 ar:8:7:0' % SEED, "-r")
    handle = int(re.search(r"^init ret=0 out=(0x[0-9a-f]+)", stdout, re.M).group(1), 16)
    pid = next(e["pid"] for e in trace if e["ph"] == "i" and e["pid"] < COMM_TRACK_BASE)
    label = "NCCL comm 0x%x (pid %d)" % (handle, pid)
    track = next(e["pid"] for e in trace if e["ph"] == "M" and e["args"]["name"] == label)
    assert _named(trace, "process_name", track) == {0: label}
    assert list(_named(trace, "thread_name", track).values()) == [label]
    marks = [e for e in trace if e["pid"] == track and e["ph"] != "M"]
    assert [(e["name"], e["ph"], e["cat"], e["args"]["count"]) for e in marks] == [
        ("ncclAllReduce #1", "i", "nccl comm", 4), ("ncclAllReduce #2", "i", "nccl comm", 8)]
