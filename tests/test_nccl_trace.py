"""NCCL traced for real: probes on the stand-in libnccl.so.2 (tests/native/fakenccl.c) driven
by the rank program (tests/native/nccl_rank.c), and on NVIDIA's libnccl.so.2 from the
nvidia-nccl-cu12 wheel (no GPU: its calls fail, their arguments and results are still exact).

The rank program prints what it passed and got back; the events must say exactly that, with
each call's communicator (comm_id, rank, nranks) and each collective's sequence number.
"""
import json
import os
import re
import subprocess
import time

import pytest

from ebpf_cuda.targets import discovery
from ebpf_cuda.decode.events import ENTER, EXIT
from ebpf_cuda.decode.nccl import split_id
from ebpf_cuda.output.savefile import load
from ebpf_cuda.tracer import Tracer
from fakenccl import (RECV, SEND, STREAM, build_fake_nccl, build_rank_prog, id_hash, unique_id,
                      wheel_libnccl)
from helpers import cli_argv, cli_env, run_cli, trace_command
from test_trace_e2e import _pairs

pytestmark = pytest.mark.kernel

SEED = 7
ID = id_hash(unique_id(SEED))


@pytest.fixture(scope="module")
def nccl(cc):
    return build_fake_nccl(cc)


@pytest.fixture(scope="module")
def rank_prog(nccl):
    return nccl[1]


def _calls(events):
    """(api, args, ret, outs) of each complete call, checking enter/exit pairs."""
    return [(e.api, e.args, x.ret, x.outs) for e, x in _pairs(events)]


def _coll(comm, seq, comm_id=ID, rank=2, nranks=4, **args):
    """A collective's arguments as its events carry them (buffers and stream of the rank
    program, the communicator's values)."""
    base = {"sendbuff": SEND, "recvbuff": RECV, "comm": comm, "stream": STREAM,
            "comm_id": comm_id, "rank": rank, "nranks": nranks, "seq": seq}
    base.update(args)
    return base


def test_every_nccl_function_on_the_stand_in(rank_prog):
    ops = ["ar:1024:7:0", "arcfg:16:8:2", "bc:256:7:3", "bcast:8:2:1", "rd:4:8:2:1", "ag:16:9",
           "rs:4:7:4", "a2a:2:0", "ga:1:1:0", "sc:1:1:3", "send:8:7:0", "recv:8:7:1", "gs",
           "ge", "ge", "userrank", "count", "cudev", "split:2:5", "userrank", "count",
           "ar:4:8:1", "destroy", "finalize", "sc:1:1:9", "destroy", "nullcomm", "ar:1:1:0"]
    events, lines, tracer = trace_command([rank_prog, "4", "2", SEED, *ops], api="nccl")
    comm = lines[0].out
    split = next(line.out for line in lines if line.fn == "ncclCommSplit")
    sid = split_id(ID, 2, 1)
    dt = {"datatype": "ncclFloat32"}
    expected = [
        ("ncclCommInitRank", {"nranks": 4, "commId": ID, "rank": 2, "comm_id": ID}, 0,
         {"comm": comm}),
        ("ncclAllReduce", _coll(comm, 1, count=1024, bytes=4096, op="ncclSum", **dt), 0, {}),
        ("ncclAllReduce", _coll(comm, 2, count=16, datatype="ncclFloat64", bytes=128,
                                op="ncclMax"), 0, {}),
        ("ncclBroadcast", _coll(comm, 3, count=256, bytes=1024, root=3, **dt), 0, {}),
        ("ncclBroadcast", _coll(comm, 4, sendbuff=RECV, count=8, datatype="ncclInt32",
                                bytes=32, root=1), 0, {}),
        ("ncclReduce", _coll(comm, 5, count=4, datatype="ncclFloat64", bytes=32, op="ncclMax",
                             root=1), 0, {}),
        ("ncclAllGather", _coll(comm, 6, sendcount=16, datatype="ncclBfloat16", bytes=32), 0,
         {}),
        ("ncclReduceScatter", _coll(comm, 7, recvcount=4, bytes=16, op="ncclAvg", **dt), 0,
         {}),
        ("ncclAlltoAll", _coll(comm, 8, count=2, datatype="ncclInt8", bytes=2), 0, {}),
        ("ncclGather", _coll(comm, 9, count=1, datatype="ncclUint8", bytes=1, root=0), 0, {}),
        ("ncclScatter", _coll(comm, 10, count=1, datatype="ncclUint8", bytes=1, root=3), 0,
         {}),
        ("ncclSend", {"sendbuff": SEND, "count": 8, "bytes": 32, "peer": 0, "comm": comm,
                      "stream": STREAM, "comm_id": ID, "rank": 2, "nranks": 4, **dt}, 0, {}),
        ("ncclRecv", {"recvbuff": RECV, "count": 8, "bytes": 32, "peer": 1, "comm": comm,
                      "stream": STREAM, "comm_id": ID, "rank": 2, "nranks": 4, **dt}, 0, {}),
        ("ncclGroupStart", {}, 0, {}),
        ("ncclGroupEnd", {}, 0, {}),
        ("ncclGroupEnd", {}, 5, {}),
        ("ncclCommUserRank", {"comm": comm, "comm_id": ID, "rank": 2, "nranks": 4}, 0,
         {"rank": 2}),
        ("ncclCommCount", {"comm": comm, "comm_id": ID, "rank": 2, "nranks": 4}, 0,
         {"count": 4}),
        ("ncclCommCuDevice", {"comm": comm, "comm_id": ID, "rank": 2, "nranks": 4}, 0,
         {"device": 0}),
        ("ncclCommSplit", {"comm": comm, "color": 2, "key": 5, "config": 0, "comm_id": ID,
                           "rank": 2, "nranks": 4, "device": 0}, 0, {"newcomm": split}),
        # the split-off communicator: its id from the parent's, its rank and size asked
        ("ncclCommUserRank", {"comm": split, "comm_id": sid}, 0, {"rank": 1}),
        ("ncclCommCount", {"comm": split, "comm_id": sid, "rank": 1}, 0, {"count": 2}),
        ("ncclAllReduce", _coll(split, 1, sid, 1, 2, count=4, datatype="ncclFloat64",
                                bytes=32, op="ncclProd"), 0, {}),
        ("ncclCommDestroy", {"comm": split, "comm_id": sid, "rank": 1, "nranks": 2}, 0, {}),
        ("ncclCommFinalize", {"comm": comm, "comm_id": ID, "rank": 2, "nranks": 4,
                              "device": 0}, 0, {}),
        ("ncclScatter", _coll(comm, 11, count=1, datatype="ncclUint8", bytes=1, root=9,
                              device=0), 4, {}),
        ("ncclCommDestroy", {"comm": comm, "comm_id": ID, "rank": 2, "nranks": 4,
                             "device": 0}, 0, {}),
        ("ncclAllReduce", {"sendbuff": SEND, "recvbuff": RECV, "count": 1, "bytes": 1,
                           "datatype": "ncclUint8", "op": "ncclSum", "comm": 0,
                           "stream": STREAM}, 4, {}),
    ]
    got = _calls(events)
    assert [g[0] for g in got] == [e[0] for e in expected]
    for g, e in zip(got, expected):
        assert g == e, g[0]
    # the program's own results, line for line (ncclBcast is traced as the ncclBroadcast it
    # calls, ncclAllReduceConfig as the ncclAllReduce row)
    assert [ret for _, _, ret, _ in got] == [line.ret for line in lines]
    names = {x.ret_name for x in events if x.phase == EXIT}
    assert names == {"ncclSuccess", "ncclInvalidUsage", "ncclInvalidArgument"}
    assert tracer.stats_at_end["lost"] == 0


def test_init_variants_and_init_all(rank_prog):
    for init, fn in (("config", "ncclCommInitRankConfig"),
                     ("scalable", "ncclCommInitRankScalable")):
        events, lines, _ = trace_command([rank_prog, "--init=" + init, "3", "1", 99, "ag:4:7"],
                                         api="nccl")
        uid = id_hash(unique_id(99))
        assert _calls(events) == [
            (fn, {"nranks": 3, "commId": uid, "rank": 1, "comm_id": uid}, 0,
             {"comm": lines[0].out}),
            ("ncclAllGather", _coll(lines[0].out, 1, uid, 1, 3, sendcount=4, bytes=16,
                                    datatype="ncclFloat32"), 0, {})]
    events, lines, _ = trace_command([rank_prog, "--init=all:2", "1", "0", 0, "ar:8:7:0",
                                      "cudev"], api="nccl")
    calls = _calls(events)
    assert [c[0] for c in calls] == ["ncclCommInitAll", "ncclAllReduce", "ncclCommCuDevice"]
    init_id = calls[0][1]["comm_id"]
    assert calls[0][1:] == ({"ndev": 2, "devlist": 0, "comm_id": init_id}, 0,
                            {"comm": lines[0].out})
    assert calls[1][1] == _coll(lines[0].out, 1, init_id, 0, 2, count=8, bytes=32,
                                datatype="ncclFloat32", op="ncclSum")


def test_entries_and_no_returns_number_collectives_once(rank_prog):
    ops = ["ar:1:7:0", "bc:2:7:0", "gs", "ge", "ar:3:7:0"]
    events, lines, _ = trace_command([rank_prog, "2", "0", SEED, *ops], api="nccl",
                                     entries=True)
    # --entries: each call's entry is a record of its own; its exit carries the same numbers
    seqs = [(e.api, e.phase, e.args.get("seq")) for e in events
            if e.api in ("ncclAllReduce", "ncclBroadcast")]
    assert seqs == [("ncclAllReduce", ENTER, 1), ("ncclAllReduce", EXIT, 1),
                    ("ncclBroadcast", ENTER, 2), ("ncclBroadcast", EXIT, 2),
                    ("ncclAllReduce", ENTER, 3), ("ncclAllReduce", EXIT, 3)]
    assert all(e.args.get("comm_id") == ID for e in events
               if e.api not in ("ncclGroupStart", "ncclGroupEnd")
               and (e.api, e.phase) != ("ncclCommInitRank", ENTER))  # (made at its exit)
    # -r: no return values, so no communicator is known, but collectives are still numbered
    events, lines, _ = trace_command([rank_prog, "2", "0", SEED, *ops], api="nccl",
                                     return_probes=False)
    assert all(e.phase == ENTER for e in events)
    assert [(e.api, e.args.get("seq"), "comm_id" in e.args) for e in events] == [
        ("ncclCommInitRank", None, False), ("ncclAllReduce", 1, False),
        ("ncclBroadcast", 2, False), ("ncclGroupStart", None, False),
        ("ncclGroupEnd", None, False), ("ncclAllReduce", 3, False)]


def test_text_json_and_summary_show_the_communicator(rank_prog, tmp_path):
    argv = [rank_prog, "2", "1", SEED, "ar:1024:7:0", "ar:1024:7:0", "bc:256:2:0", "ge"]
    done = run_cli("-t", "--api", "nccl", "--", *argv)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines()
             if re.match(r"nccl_rank +\d+ +ncclBroadcast ", line)]
    assert re.search(r"ncclBroadcast +\[ENTER\] sendbuff=0xa0000000 recvbuff=0xb0000000 "
                     r"count=256 datatype=ncclInt32 bytes=1024 root=0 comm=0x[0-9a-f]+ "
                     r"stream=0x5000 comm_id=%s rank=1 nranks=2 seq=3$" % ID, lines[0])
    assert "[EXIT] returned=ncclSuccess (" in lines[1]
    assert re.search(r"ncclGroupEnd +\[EXIT\] returned=ncclInvalidUsage", done.stdout)
    done = run_cli("--json", "--api", "nccl", "--", *argv)
    objects = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    exits = [o for o in objects if o["api"] == "ncclAllReduce" and o["phase"] == "exit"]
    assert [(o["args"]["seq"], o["args"]["comm_id"], o["args"]["rank"], o["args"]["bytes"],
             o["args"]["datatype"], o["ret_name"]) for o in exits] == [
        (1, ID, 1, 4096, "ncclFloat32", "ncclSuccess"),
        (2, ID, 1, 4096, "ncclFloat32", "ncclSuccess")]
    # the NCCL table: from events (with -o) and with --summary alone (in-kernel aggregates;
    # NCCL calls still write their records)
    for extra in (["-o", str(tmp_path / "events.txt")], []):
        done = run_cli("--summary", "--api", "nccl", *extra, "--", *argv)
        assert done.returncode == 0, done.stderr
        table = done.stdout.split("NCCL Summary", 1)[1].splitlines()
        rows = {tuple(line.split()[-2:]): line.split() for line in table if ID in line}
        assert rows[("ncclAllReduce", ID)][:2] == ["2", "0.008"]  # calls, MB
        assert rows[("ncclBroadcast", ID)][:2] == ["1", "0.001"]
        assert rows[("ncclAllReduce", ID)][7] == "1"  # ranks


def _wait_all(processes, timeout=120):
    deadline = time.monotonic() + timeout
    results = []
    for p in processes:
        out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
        results.append((p.returncode, out, err))
    return results


def test_two_ranks_in_one_trace_and_one_that_stopped(nccl, rank_prog, tmp_path):
    """Both ranks under one tracer, saved in one file: the merged report finds rank 1 never
    entered collective #3 (it stopped after #2), and names its last collective."""
    meet = tmp_path / "meet"
    meet.mkdir()
    script = ('"$0" 2 0 5 ar:64:7:0 bc:64:7:0 ar:32:7:0 & "$0" 2 1 5 ar:64:7:0 bc:64:7:0; '
              'wait')
    saved = tmp_path / "both.ebpfcuda"
    done = run_cli("--api", "nccl", "-p", nccl[0], "--save", saved, "--", "sh", "-c", script,
                   rank_prog,
                   env=cli_env(FAKENCCL_RENDEZVOUS=str(meet)))
    assert done.returncode == 0, done.stderr
    report = run_cli("report", "--collectives", saved)
    assert report.returncode == 0, report.stderr
    text = report.stdout
    uid = id_hash(unique_id(5))
    assert "Communicator %s: 2 ranks of 2 in the traces, 3 collectives" % uid in text
    assert re.search(r"rank 1 never entered #3 ncclAllReduce \(count 32, ncclFloat32, ncclSum\) "
                     r"\(entered by rank 0\); its last: #2 ncclBroadcast at \d\d:\d\d:", text)
    assert "Mismatched" not in text and "Skipped" not in text
    assert "Clocks: one host" in text
    # each pass over a saved trace numbers its collectives from the top
    trace = load(str(saved))
    passes = [[(e.pid, e.args.get("seq")) for e in trace if e.api == "ncclAllReduce"]
              for _ in range(2)]
    assert passes[0] == passes[1] and sorted(seq for _, seq in passes[0]) == [1, 1, 1, 1, 3, 3]
    # other outputs want one file; a file that is not a trace is a one-line error
    done = run_cli("report", "--summary", saved, saved)
    assert done.returncode == 2 and "--summary: with several FILEs" in done.stderr
    (tmp_path / "junk").write_text("junk")
    done = run_cli("report", saved, tmp_path / "junk")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1


# The job of the merged report's test: 4 ranks; rank 1 skips collective #4, rank 2 comes
# 300 ms late to #3, rank 3 passes count 2048 to #2.
JOB = ["ar:1024:7:0", "ar:1024:7:0", "bc:256:7:0", "ag:512:7", "rs:128:7:0", "ar:64:7:0"]
LATE_MS = 300


def _rank_ops(rank: int):
    ops = list(JOB)
    if rank == 1:
        del ops[3]
    if rank == 2:
        ops.insert(2, "sleep:%d" % LATE_MS)
    if rank == 3:
        ops[1] = "ar:2048:7:0"
    return ops


def test_four_ranks_traced_apart_and_merged(rank_prog, tmp_path):
    meet = tmp_path / "meet"
    meet.mkdir()
    env = cli_env(FAKENCCL_RENDEZVOUS=str(meet))
    files = [tmp_path / ("r%d.ebpfcuda" % r) for r in range(4)]
    tracers = [subprocess.Popen(cli_argv("--api", "nccl", "--save", files[r], "--", rank_prog,
                                         4, r, 11, *_rank_ops(r)),
                                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for r in range(4)]
    for code, out, err in _wait_all(tracers):
        assert code == 0, err
    done = run_cli("report", *files)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    uid = id_hash(unique_id(11))
    assert "Communicator %s: 4 ranks of 4 in the traces, 6 collectives" % uid in text
    for r in range(4):
        assert "rank %d (%s pid " % (r, files[r]) in text
    assert ("rank 1 skipped #4 ncclAllGather (sendcount 512, ncclFloat32): its #4-#5 are the "
            "others' #5-#6") in text
    assert "Never entered" not in text  # (rank 1's missing #6 is its skip)
    mismatches = text.split("Mismatched arguments:\n", 1)[1].split("  Arrival", 1)[0]
    assert mismatches.strip().splitlines() == [
        "#2 ncclAllReduce count: rank 3 2048; ranks 0, 1, 2 1024"]
    arrival = text.split("Arrival spread", 1)[1]
    assert "3 collectives entered by every rank" in arrival  # #1-#3 (rank 1 skipped #4)
    widest = re.search(r"widest: #(\d) ([\d.,]+) ms \(last: rank (\d)\)", arrival)
    assert widest.group(1) == "3" and widest.group(3) == "2"
    # (measured from the first rank to enter #3: the others may have entered #2 up to a
    # scheduling delay after rank 2 did, so a little under LATE_MS is right too)
    assert float(widest.group(2).replace(",", "")) >= LATE_MS - 50
    row = next(line for line in arrival.splitlines() if line.strip().startswith("rank 2"))
    assert row.split()[-1] == "#3"


def test_discovery_finds_the_libnccl_a_process_maps(rank_prog, nccl):
    """-d PID with --api all: the libnccl.so.2 the process mapped is probed with the rest."""
    proc = subprocess.Popen([str(rank_prog), "2", "0", str(SEED), "wait", "ar:8:7:0", "ge"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("init ret=0")
        assert discovery.nccl_libraries(proc.pid) == [os.path.realpath(nccl[0])]
        with Tracer(pid=proc.pid, functions=["nccl*"]) as tracer:
            assert {a.path for a in tracer.attachments} == {os.path.realpath(nccl[0])}
            proc.stdin.write("go\n")
            proc.stdin.flush()
            events = list(tracer.events(timeout=30))
    finally:
        proc.kill() if proc.poll() is None else None
        proc.wait()
    # made before the trace began: the communicator has no id, its collectives are numbered
    assert [(e.api, e.phase, e.args.get("seq"), "comm_id" in e.args) for e in events] == [
        ("ncclAllReduce", ENTER, 1, False), ("ncclAllReduce", EXIT, 1, False),
        ("ncclGroupEnd", ENTER, None, False), ("ncclGroupEnd", EXIT, None, False)]


# ---- NVIDIA's libnccl.so.2 --------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_rank_prog(cc):
    lib = wheel_libnccl()
    if lib is None:
        pytest.skip("nvidia-nccl-cu12 is not installed")
    (cc.outdir / "realnccl").mkdir(exist_ok=True)
    return lib, build_rank_prog(cc, lib, "realnccl/nccl_rank")


def test_real_libnccl_without_a_gpu(real_rank_prog):
    lib, prog = real_rank_prog
    ops = ["ar:1024:7:0", "bc:256:9:1", "ag:16:2", "send:4:7:1", "gs", "ge", "ge", "count",
           "destroy"]
    events, lines, tracer = trace_command([prog, "--getid", "2", "1", SEED, *ops], api="nccl")
    assert {a.path for a in tracer.attachments} == {os.path.realpath(lib)}
    uid = id_hash(bytes.fromhex(lines[0].fields["id"]))  # what ncclGetUniqueId made
    calls = _calls(events)
    assert [c[0] for c in calls] == [
        "ncclGetUniqueId", "ncclCommInitRank", "ncclAllReduce", "ncclBroadcast",
        "ncclAllGather", "ncclSend", "ncclGroupStart", "ncclGroupEnd", "ncclGroupEnd",
        "ncclCommCount", "ncclCommDestroy"]
    assert [c[2] for c in calls] == [line.ret for line in lines]
    # without a GPU the init fails (no communicator) and the calls on NULL are refused
    assert calls[1][1:] == ({"nranks": 2, "commId": uid, "rank": 1}, lines[1].ret, {})
    assert lines[1].ret != 0 and lines[1].out == 0
    null = {"comm": 0, "stream": STREAM}
    assert calls[2][1] == dict(null, sendbuff=SEND, recvbuff=RECV, count=1024,
                               datatype="ncclFloat32", bytes=4096, op="ncclSum")
    assert calls[3][1] == dict(null, sendbuff=SEND, recvbuff=RECV, count=256,
                               datatype="ncclBfloat16", bytes=512, root=1)
    assert calls[4][1] == dict(null, sendbuff=SEND, recvbuff=RECV, sendcount=16,
                               datatype="ncclInt32", bytes=64)
    assert calls[5][1] == dict(null, sendbuff=SEND, count=4, datatype="ncclFloat32", bytes=16,
                               peer=1)
    names = [x.ret_name for x in events if x.phase == EXIT]
    assert names[2] == "ncclInvalidArgument" and names[7:9] == ["ncclSuccess",
                                                                 "ncclInvalidUsage"]


def test_the_html_report_has_the_nccl_table_of_the_text_summary(rank_prog, tmp_path):
    argv = [rank_prog, "2", "1", SEED, "ar:1024:7:0", "ar:1024:7:0", "bc:256:2:0", "ge"]
    page = tmp_path / "report.html"
    done = run_cli("--summary", "--report", str(page), "-o", str(tmp_path / "t.txt"),
                   "--api", "nccl", "--", *argv)
    assert done.returncode == 0, done.stderr
    table = done.stdout.split("NCCL Summary", 1)[1].splitlines()
    text_rows = {tuple(line.split()[-2:]): line.split()[:2] for line in table if ID in line}
    html = page.read_text()
    section = html.split("<h2>NCCL (host-side time of the calls)</h2>", 1)[1].split("<h2", 1)[0]
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in section.split("<tr>")[1:]]
    html_rows = {tuple(c[-2:]): c[:2] for c in cells if c}
    assert html_rows == text_rows and set(html_rows) == {("ncclAllReduce", ID),
                                                         ("ncclBroadcast", ID)}
