"""`--save run-%r.ebpfcuda`: one saved trace per traced process (rank_files.py), for real: one
command (a shell script, as torchrun or mpirun would) starts several stand-in ranks
(tests/native/nccl_rank.c on tests/native/fakenccl.c); each file must hold exactly its
process's calls, be named by its rank (RANK in its environment, else its NCCL rank) or pid,
and `ebpf-cuda report` of the files must merge the ranks."""
import re

import pytest

from ebpf_cuda.output import rank_files
from ebpf_cuda.errors import UsageError
from ebpf_cuda.decode.events import ENTER, EXIT
from ebpf_cuda.output.savefile import load
from fakenccl import build_fake_nccl, id_hash, unique_id
from helpers import cli_env, run_cli
from test_nccl_trace import _rank_ops
from test_trace_e2e import _pairs

pytestmark = pytest.mark.kernel

SEED = 21
ID = id_hash(unique_id(SEED))


@pytest.fixture(scope="module")
def nccl(cc):
    return build_fake_nccl(cc)


def _calls(trace):
    """(pid, api, args without the buffers and stream, ret) of each complete call."""
    events = list(trace)
    return [(x.pid, x.api, x.args, x.ret) for e, x in _pairs(events)]


def _op_names(ops):
    """The NCCL functions the rank program calls for its OPs (tests/native/nccl_rank.c)."""
    names = {"ar": "ncclAllReduce", "bc": "ncclBroadcast", "ag": "ncclAllGather",
             "rs": "ncclReduceScatter", "ge": "ncclGroupEnd", "gs": "ncclGroupStart"}
    return [names[op.split(":")[0]] for op in ops if not op.startswith("sleep")]


def _run_job(nccl, tmp_path, pattern, script, *extra, **env):
    """`ebpf-cuda --api nccl --save PATTERN -- sh -c SCRIPT RANK_PROG` in tmp_path; the
    files it wrote, by name."""
    meet = tmp_path / "meet"
    meet.mkdir(exist_ok=True)
    done = run_cli("--api", "nccl", "-p", nccl[0], "--save", tmp_path / pattern, *extra,
                   "--", "sh", "-c", script, nccl[1],
                   env=cli_env(FAKENCCL_RENDEZVOUS=str(meet), **env), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return {p.name: p for p in tmp_path.iterdir() if p.suffix == ".ebpfcuda"}, done


def _check_rank_file(path, rank, nranks, ops, comm_id=ID):
    """The file holds one process's calls: its init, then exactly its OPs in order, every
    one on its communicator with its rank."""
    trace = load(str(path))
    assert trace.complete and not trace.truncated
    calls = _calls(trace)
    assert len({pid for pid, _, _, _ in calls}) == 1, path
    assert [api for _, api, _, _ in calls] == ["ncclCommInitRank"] + _op_names(ops)
    assert calls[0][2]["rank"] == rank and calls[0][2]["nranks"] == nranks
    seq = 0
    for _, api, args, ret in calls[1:]:
        if api.startswith("ncclGroup"):
            continue
        seq += 1
        assert (args["comm_id"], args["rank"], args["nranks"], args["seq"], ret) == (
            comm_id, rank, nranks, seq, 0)
    assert trace.losses.ring_full == 0
    return calls[0][0]


def test_two_ranks_by_their_rank_variable_and_one_that_shares_it(nccl, tmp_path):
    """RANK=0 and RANK=1 from one shell script; a third process (a job of its own, one rank)
    also says RANK=0: it gets a name of its own, `0-pidPID`."""
    ops = {0: ["ar:64:7:0", "bc:32:7:0", "ar:16:7:0"], 1: ["ar:64:7:0", "bc:32:7:0"]}
    script = ('RANK=0 "$0" 2 0 %d %s & RANK=1 "$0" 2 1 %d %s & RANK=0 "$0" 1 0 99 ag:8:7 & '
              'wait' % (SEED, " ".join(ops[0]), SEED, " ".join(ops[1])))
    files, _ = _run_job(nccl, tmp_path, "run-%r.ebpfcuda", script)
    shared = [n for n in files if n.startswith("run-0-pid")]
    assert len(files) == 3 and len(shared) == 1 and "run-1.ebpfcuda" in files
    # the first RANK=0 process to make a traced call has run-0, the other run-0-pidPID
    lone = next(n for n in ("run-0.ebpfcuda", shared[0])
                if [e.args["nranks"] for e in load(str(files[n]))][0] == 1)
    job = ({"run-0.ebpfcuda", shared[0]} - {lone}).pop()
    pids = {0: _check_rank_file(files[job], 0, 2, ops[0]),
            1: _check_rank_file(files["run-1.ebpfcuda"], 1, 2, ops[1])}
    lone_pid = _check_rank_file(files[lone], 0, 1, ["ag:8:7"], id_hash(unique_id(99)))
    assert len({pids[0], pids[1], lone_pid}) == 3
    assert shared[0] == "run-0-pid%d.ebpfcuda" % (lone_pid if lone == shared[0] else pids[0])
    # the files of the job merge: rank 1 never entered #3
    done = run_cli("report", files[job], files["run-1.ebpfcuda"])
    assert done.returncode == 0, done.stderr
    assert "Communicator %s: 2 ranks of 2 in the traces, 3 collectives" % ID in done.stdout
    assert re.search(r"rank 1 never entered #3 ncclAllReduce \(count 16, ncclFloat32, ncclSum\) "
                     r"\(entered by rank 0\); its last: #2 ncclBroadcast", done.stdout)


def test_four_ranks_named_by_their_nccl_rank_then_merged(nccl, tmp_path):
    """No RANK variable: each file is named by its pid until its communicator tells its rank
    (ncclCommInitRank), then renamed; `report run-*.ebpfcuda` finds the skip, the late rank
    and the mismatch of the job (test_nccl_trace's JOB)."""
    script = " & ".join('"$0" 4 %d %d %s' % (r, SEED, " ".join(_rank_ops(r)))
                        for r in range(4)) + " & wait"
    files, _ = _run_job(nccl, tmp_path, "job-%r.ebpfcuda", script)
    assert sorted(files) == ["job-%d.ebpfcuda" % r for r in range(4)]
    pids = [_check_rank_file(files["job-%d.ebpfcuda" % r], r, 4, _rank_ops(r))
            for r in range(4)]
    assert len(set(pids)) == 4
    done = run_cli("report", *[files["job-%d.ebpfcuda" % r] for r in range(4)])
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "Communicator %s: 4 ranks of 4 in the traces, 6 collectives" % ID in text
    for r in range(4):
        assert "rank %d (%s pid %d)" % (r, files["job-%d.ebpfcuda" % r], pids[r]) in text
    assert ("rank 1 skipped #4 ncclAllGather (sendcount 512, ncclFloat32): its #4-#5 are the "
            "others' #5-#6") in text
    assert "#2 ncclAllReduce count: rank 3 2048; ranks 0, 1, 2 1024" in text
    widest = re.search(r"widest: #(\d) [\d.,]+ ms \(last: rank (\d)\)", text)
    assert widest.groups() == ("3", "2")


def test_pid_pattern_and_entries(nccl, tmp_path):
    """%p: each file named by its process's pid; with --entries too (entry records and their
    exits both in the process's file) and --summary (the events decoded for another output:
    the files get the same frames)."""
    script = '"$0" 2 0 %d ar:8:7:0 & "$0" 2 1 %d ar:8:7:0 & wait' % (SEED, SEED)
    files, done = _run_job(nccl, tmp_path, "p%p-r%r.ebpfcuda", script, "--entries",
                           "--summary")
    assert "NCCL Summary" in done.stdout
    assert len(files) == 2
    for name, path in files.items():
        events = list(load(str(path)))
        pid, rank = map(int, re.match(r"p(\d+)-r(\d+)\.ebpfcuda$", name).groups())
        assert {e.pid for e in events} == {pid}
        assert [(e.api, e.phase) for e in events] == [
            ("ncclCommInitRank", ENTER), ("ncclCommInitRank", EXIT),
            ("ncclAllReduce", ENTER), ("ncclAllReduce", EXIT)]
        assert events[-1].args["rank"] == rank and events[-1].args["seq"] == 1


def test_losses_of_the_shared_ring_are_in_every_file(robust, tmp_path):
    """A ring too small for two busy processes: each file records every loss of the ring
    (what it lost cannot be told apart by process), and holds only its process's calls."""
    lib, prog = robust
    calls = 4 * 5000
    done = run_cli("-p", lib, "--save", tmp_path / "busy-%p.ebpfcuda", "--ring-size", "4096",
                   "--", "sh", "-c", '"$0" threads 4 5000 & "$0" threads 4 5000; wait', prog,
                   timeout=180)
    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in re.findall(r"made=%d pid=(\d+)" % calls, done.stdout)]
    lost_line = [line for line in done.stderr.splitlines() if " lost: " in line]
    assert len(pids) == 2 and len(lost_line) == 1, (done.stdout, done.stderr)
    lost = int(lost_line[0].split("ebpf-cuda: ", 1)[1].split()[0])
    assert lost > 0
    seen = 0
    for pid in pids:
        trace = load(str(tmp_path / ("busy-%d.ebpfcuda" % pid)))
        exits = [e for e in trace if e.phase == EXIT]
        assert {e.pid for e in exits} == {pid}
        assert trace.losses.ring_full == lost
        report = run_cli("report", tmp_path / ("busy-%d.ebpfcuda" % pid), "--summary")
        assert report.returncode == 0 and lost_line[0] in report.stderr
        seen += len(exits)
    assert seen + lost == 2 * calls
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        "busy-%d.ebpfcuda" % pid for pid in pids)


def test_one_path_keeps_every_process_in_one_file_and_bad_patterns_are_refused(nccl, tmp_path):
    script = '"$0" 2 0 %d ar:8:7:0 & "$0" 2 1 %d ar:8:7:0 & wait' % (SEED, SEED)
    files, _ = _run_job(nccl, tmp_path, "all.ebpfcuda", script)
    assert list(files) == ["all.ebpfcuda"]
    events = list(load(str(files["all.ebpfcuda"])))
    assert sorted(e.args["rank"] for e in events if e.api == "ncclAllReduce"
                  and e.phase == EXIT) == [0, 1]
    assert len({e.pid for e in events}) == 2
    for pattern, words in (("x-%r-%q.ebpfcuda", "unknown %q"),
                           ("%r/x.ebpfcuda", "not in its folder"),
                           ("nowhere/x-%r.ebpfcuda", "no folder")):
        done = run_cli("--api", "nccl", "-p", nccl[0], "--save", tmp_path / pattern, "--",
                       nccl[1], "1", "0", "1")
        assert done.returncode == UsageError.exit_code, done.stderr
        assert words in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_pattern_pieces():
    assert rank_files.is_pattern("a-%r.x") and rank_files.is_pattern("a-%p")
    assert not rank_files.is_pattern("a-%%r.x") and not rank_files.is_pattern("100%.x")
    assert rank_files.expand("d/run-%r-%p-%%.x", "3", 42) == "d/run-3-42-%.x"


def test_an_output_the_pattern_may_write_is_refused(tmp_path):
    """`-o run-0.ebpfcuda` beside `--save run-%r.ebpfcuda`: rank 0's file would overwrite
    it; refused in one line before anything is opened."""
    done = run_cli("--save", str(tmp_path / "run-%r.ebpfcuda"), "-o",
                   str(tmp_path / "run-0.ebpfcuda"), "--", "true")
    assert done.returncode == UsageError.exit_code and done.stderr.count("\n") == 1
    assert "may write" in done.stderr and not list(tmp_path.iterdir())
    from ebpf_cuda.output import plan

    plan.refuse_same_files([("-o", str(tmp_path / "calls.txt")),
                            ("--save", str(tmp_path / "run-%r.ebpfcuda"))])  # (distinct)
