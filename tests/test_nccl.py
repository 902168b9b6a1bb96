"""NCCL's pure logic: the table's rows (against the real library's exports), the enumerations,
the values, the communicators (nccl.py) and the merge of ranks (analysis/collectives.py)."""
import os
import struct
import subprocess
from pathlib import Path

import pytest

from ebpf_cuda.spec import apis, record
from ebpf_cuda.targets import discovery
from ebpf_cuda.analysis.collectives import (Call, Clocks, CollectiveSummary, Communicator,
                                            Rank, format_communicator)
from ebpf_cuda.spec.apis import Kind
from ebpf_cuda.spec.cuda_enums import error_name, nccl_bytes, nccl_datatype_name, nccl_redop_name
from ebpf_cuda.targets.elf import open_elf
from ebpf_cuda.decode.events import ENTER, EXIT
from ebpf_cuda.decode.nccl import Communicators, init_all_id, split_id
from ebpf_cuda.decode.values import arg_fields, decode_value, field_kinds
from fakenccl import build_fake_nccl, id_hash, unique_id, wheel_libnccl
from helpers import event, run_cli

NATIVE = Path(__file__).parent / "native"

NCCL_ROWS = [api for api in apis.TABLE if api.library == apis.NCCL]
ISSUE_FUNCTIONS = {
    "ncclGetUniqueId", "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitAll",
    "ncclCommSplit", "ncclCommFinalize", "ncclCommDestroy", "ncclCommAbort", "ncclAllReduce",
    "ncclBroadcast", "ncclReduce", "ncclAllGather", "ncclReduceScatter", "ncclSend",
    "ncclRecv", "ncclGroupStart", "ncclGroupEnd", "ncclAlltoAll", "ncclGather", "ncclScatter"}


# ---- the table ---------------------------------------------------------------------------

def test_the_rows_the_issue_asks_for_and_their_shapes():
    names = {api.name for api in NCCL_ROWS}
    assert ISSUE_FUNCTIONS <= names
    for api in NCCL_ROWS:
        assert sum(a.cells for a in api.args) <= record.ARG_CELLS, api.name
        if api.category in ("collective", "p2p"):
            kinds = {a.name: a.kind for a in api.args}
            assert kinds["comm"] == Kind.NCCL_COMM and kinds["datatype"] == Kind.NCCL_DATATYPE
            assert kinds[api.count] == Kind.U64 and kinds["stream"] == Kind.HANDLE, api.name
            assert api.aliases == ((api.name + "Config",) if api.category == "collective"
                                   else ()), api.name
    init = apis.BY_NAME["ncclCommInitRank"]
    # SysV x86-64: the 128-byte id goes on the stack (slot 6: the first stack slot) and takes
    # no register, so `rank` after it is the third register
    assert [(a.name, a.slot, a.cells) for a in init.args] == [
        ("nranks", 1, 1), ("commId", 6, 8), ("rank", 2, 1)]
    assert apis.select(library="nccl") == [a for a in NCCL_ROWS if a.default]


def test_every_row_is_exported_by_nvidias_libnccl():
    lib = wheel_libnccl()
    if lib is None:
        pytest.skip("nvidia-nccl-cu12 is not installed")
    symbols = [s for api in NCCL_ROWS for s in api.symbols]
    elf = open_elf(str(lib))
    assert set(elf.has_any(symbols)) == set(symbols)
    # no two rows at one address (one call would be two events)
    offsets = [elf.symbol_offset(s) for s in symbols]
    assert len(set(offsets)) == len(offsets)


def test_results_types_and_ops_by_name():
    assert error_name(4, apis.NCCL) == "ncclInvalidArgument"
    assert error_name(42, "nccl") == "ncclResult(42)"
    assert error_name(1, True) == error_name(1, apis.DRIVER) == "CUDA_ERROR_INVALID_VALUE"
    assert error_name(1) == error_name(1, apis.RUNTIME) == "cudaErrorInvalidValue"
    assert [nccl_datatype_name(t) for t in (0, 7, 9, 11, 12)] == [
        "ncclInt8", "ncclFloat32", "ncclBfloat16", "ncclFloat8e5m2", "ncclDataType(12)"]
    assert [nccl_bytes(10, t) for t in (0, 2, 4, 6, 7, 8, 9, 10, 99)] == [
        10, 40, 80, 20, 40, 80, 20, 10, None]
    assert [nccl_redop_name(o) for o in (0, 4, 5)] == ["ncclSum", "ncclAvg", "ncclRedOp(5)"]


def test_values_unique_id_hash_and_bytes():
    data = unique_id(7)
    cells = struct.unpack("<8Q", data[:64])
    assert decode_value(Kind.UNIQUE_ID, cells) == id_hash(data)
    fields = [f.name for f in arg_fields(apis.BY_NAME["ncclAllGather"])]
    assert fields == ["sendbuff", "recvbuff", "sendcount", "datatype", "bytes", "comm", "stream"]
    kinds = field_kinds(apis.BY_NAME["ncclAllReduce"])
    assert (kinds["comm_id"], kinds["seq"], kinds["bytes"]) == (Kind.STRING, Kind.U64, Kind.U64)


# ---- communicators -------------------------------------------------------------------------

def _call(api, args, ret=0, outs=None, pid=10, tid=None, ts_ns=10**9):
    """The two events of one record (one arguments dict), as the decoder makes them."""
    args = dict(args)
    enter = event(api, ENTER, args, ts_ns=ts_ns, pid=pid, tid=tid)
    enter.args = args
    done = event(api, EXIT, args, ts_ns=ts_ns + 1000, pid=pid, tid=tid, ret=ret,
                 duration_ns=1000, outs=dict(outs or {}))
    done.args = args
    return [enter, done]


def test_communicators_tie_rank_size_id_and_number_collectives():
    c = Communicators()
    init = _call("ncclCommInitRank", {"nranks": 4, "commId": "abc", "rank": 3},
                 outs={"comm": 0x100})
    c.annotate(init)
    assert init[0].args["comm_id"] == "abc"
    seqs = []
    for api in ("ncclAllReduce", "ncclBroadcast", "ncclSend", "ncclAllReduce"):
        events = _call(api, {"comm": 0x100, "count": 1})
        c.annotate(events)
        seqs.append((events[1].args.get("seq"), events[1].args["rank"],
                     events[1].args["nranks"], events[1].args["comm_id"]))
    assert seqs == [(1, 3, 4, "abc"), (2, 3, 4, "abc"), (None, 3, 4, "abc"), (3, 3, 4, "abc")]
    # a failed collective was still entered: it is counted
    failed = _call("ncclAllReduce", {"comm": 0x100}, ret=4)
    c.annotate(failed)
    assert failed[0].args["seq"] == 4
    # another process's handle of the same value is another communicator
    other = _call("ncclAllReduce", {"comm": 0x100}, pid=11)
    c.annotate(other)
    assert other[0].args == {"comm": 0x100, "seq": 1}


def test_split_learned_values_and_destroy():
    c = Communicators()
    c.annotate(_call("ncclCommInitRank", {"nranks": 4, "commId": "abc", "rank": 2},
                     outs={"comm": 0x100}))
    c.annotate(_call("ncclCommSplit", {"comm": 0x100, "color": 1, "key": 0},
                     outs={"newcomm": 0x200}))
    c.annotate(_call("ncclCommSplit", {"comm": 0x100, "color": 1, "key": 0},
                     outs={"newcomm": 0x300}))
    c.annotate(_call("ncclCommSplit", {"comm": 0x100, "color": -1, "key": 0},
                     outs={"newcomm": 0}))
    assert c.get(10, 0x200).comm_id == split_id("abc", 1, 1) != split_id("abc", 1, 2)
    assert c.get(10, 0x300).comm_id == split_id("abc", 1, 2)
    c.annotate(_call("ncclCommUserRank", {"comm": 0x200}, outs={"rank": 1}))
    c.annotate(_call("ncclCommCount", {"comm": 0x200}, outs={"count": 2}))
    c.annotate(_call("ncclCommCuDevice", {"comm": 0x200}, outs={"device": 5}))
    events = _call("ncclReduce", {"comm": 0x200})
    c.annotate(events)
    assert events[0].args == {"comm": 0x200, "comm_id": split_id("abc", 1, 1), "rank": 1,
                              "nranks": 2, "device": 5, "seq": 1}
    c.annotate(_call("ncclCommDestroy", {"comm": 0x200}))
    assert c.get(10, 0x200) is None
    c.annotate(_call("ncclCommInitAll", {"ndev": 2}, outs={"comm": 0x400}, ts_ns=5000))
    assert c.get(10, 0x400).shown() == {"comm_id": init_all_id(10, 5000), "rank": 0,
                                        "nranks": 2}


def test_entries_alone_and_exits_alone_keep_their_number():
    c = Communicators()
    c.annotate(_call("ncclCommInitRank", {"nranks": 2, "commId": "id", "rank": 0},
                     outs={"comm": 0x100}))
    # --entries: the entry is a record of its own, the exit another (its own arguments)
    first = event("ncclAllReduce", ENTER, {"comm": 0x100}, pid=10, tid=1)
    second = event("ncclBroadcast", ENTER, {"comm": 0x100}, pid=10, tid=2)
    c.annotate([first])
    c.annotate([second])
    done_second = event("ncclBroadcast", EXIT, {"comm": 0x100}, pid=10, tid=2, ret=0,
                        duration_ns=5)
    done_first = event("ncclAllReduce", EXIT, {"comm": 0x100}, pid=10, tid=1, ret=0,
                       duration_ns=5)
    c.annotate([done_second])
    c.annotate([done_first])
    assert [e.args["seq"] for e in (first, second, done_first, done_second)] == [1, 2, 1, 2]
    # an exit whose entry record was lost is counted when it comes
    lost = event("ncclAllReduce", EXIT, {"comm": 0x100}, pid=10, ret=0, duration_ns=5)
    c.annotate([lost])
    assert lost.args["seq"] == 3 and lost.args["rank"] == 0


# ---- the merge -----------------------------------------------------------------------------

def _rank(number, calls, t0=0, late=None):
    """A rank whose k-th collective (1-based) is calls[k-1]: (api, count) at t0 + k ms."""
    r = Rank("r%d.ebpfcuda" % number, 100 + number, 0x100)
    r.comm_id, r.rank, r.nranks = "abc", number, 4
    for k, (api, count) in enumerate(calls, 1):
        t = t0 + k * 10**6 + ((late or {}).get(k, 0))
        r.calls[k] = Call(k, api, count, "ncclFloat32", "ncclSum", None, t, 0)
    return r


JOB = [("ncclAllReduce", 8), ("ncclAllReduce", 8), ("ncclBroadcast", 4), ("ncclAllGather", 2),
       ("ncclAllReduce", 1)]


def test_merge_finds_a_stopped_rank_a_skip_a_mismatch_and_the_straggler():
    stopped = _rank(0, JOB[:3])
    skipper = _rank(1, JOB[:1] + JOB[2:])
    odd = _rank(2, JOB[:1] + [("ncclAllReduce", 16)] + JOB[2:])
    late = _rank(3, JOB, late={1: 5 * 10**6, 2: 5 * 10**6})
    comm = Communicator("abc", [late, odd, skipper, stopped])
    assert [r.rank for r in comm.ranks] == [0, 1, 2, 3] and comm.max_seq == 5
    assert [(m.rank.rank, m.seq, [r.rank for r in m.entered_by]) for m in comm.missing] == [
        (0, 4, [2, 3])]
    assert [(s.rank.rank, s.seq, s.skipped, s.until) for s in comm.skips] == [(1, 2, 1, 4)]
    assert [(m.seq, m.field, [(v, [r.rank for r in rs]) for v, rs in m.groups])
            for m in comm.mismatches] == [(2, "count", [(8, [0, 3]), (16, [2])])]
    # the collectives every rank entered, none of them shifted: #1 only (rank 1 skipped #2)
    assert [(a.seq, a.spread_ns, a.last.rank) for a in comm.arrivals] == [(1, 5 * 10**6, 3)]
    text = "\n".join(format_communicator(comm))
    assert "rank 0 never entered #4 ncclAllGather (sendcount 2, ncclFloat32, ncclSum) " \
           "(entered by ranks 2, 3); its last: #3 ncclBroadcast at " in text
    assert "rank 1 skipped #2 ncclAllReduce (count 8, ncclFloat32, ncclSum): its #2-#4 are " \
           "the others' #3-#5" in text
    assert "#2 ncclAllReduce count: rank 2 16; ranks 0, 3 8" in text
    assert "widest: #1 5.000 ms (last: rank 3)" in text


def test_ranks_without_a_trace_and_agreeing_ranks():
    comm = Communicator("abc", [_rank(0, JOB), _rank(2, JOB, late={3: 2000})])
    assert comm.absent == [1, 3] and not comm.missing and not comm.skips
    assert not comm.mismatches
    assert [(a.seq, a.spread_ns, a.last.rank) for a in comm.arrivals][2] == (3, 2000, 2)
    assert "no trace of ranks 1, 3" in "\n".join(format_communicator(comm))


def test_clocks_one_host_or_several():
    one = Clocks([1_000_000_000, 1_000_000_400, 999_999_900])
    assert one.aligned == [1_000_000_000] * 3 and "one host" in one.sentence()
    two = Clocks([1_000_000_000, 5_000_000_000, 1_000_000_100])
    assert two.aligned == [1_000_000_000, 5_000_000_000, 1_000_000_000]
    assert two.sentence().startswith("2 hosts")


def test_nccl_table_counts_calls_bytes_and_ranks():
    table = CollectiveSummary()
    for pid, rank in ((1, 0), (2, 1)):
        for events in (_call("ncclAllReduce", {"comm": 0x10, "comm_id": "abc", "rank": rank,
                                               "bytes": 4096}, pid=pid),
                       _call("ncclGroupEnd", {}, pid=pid)):
            for e in events:
                table.add(e)
    rows = [line.split() for line in table.table().splitlines() if "ncclAllReduce" in line]
    assert rows == [["2", "0.008", "2,000", "1,000.0", "1,000.0", "1,000", "1,000", "2",
                     "ncclAllReduce", "abc"]]
    assert "no NCCL collectives" in CollectiveSummary().table()


# ---- finding libnccl -----------------------------------------------------------------------

def test_nccl_libraries_for_a_command_a_script_and_a_static_program(cc):
    lib, prog = build_fake_nccl(cc)
    assert discovery.nccl_libraries(command=[str(prog), "1", "0", "0"]) == \
        [os.path.realpath(lib)]
    # a script: every copy found (the wheel's among them, when installed)
    found = discovery.nccl_libraries(command=["python3", "train.py"])
    assert found == discovery.find_library("libnccl")
    wheel = wheel_libnccl()
    if wheel is not None:
        assert os.path.realpath(wheel) in found
    static = cc.outdir / "fakenccl" / "static_nccl"
    subprocess.run(["gcc", "-O2", "-o", str(static), str(NATIVE / "fakenccl.c"), "-x", "c", "-"],
                   input=b"int main(void) { return 0; }", check=True)
    assert discovery.nccl_libraries(command=[str(static)]) == [os.path.realpath(static)]


def test_cli_knows_the_nccl_layer():
    done = run_cli("--list-functions")
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("nccl")]
    assert {r[0] for r in rows} == {a.name for a in NCCL_ROWS}
    assert all(r[1] == "nccl" for r in rows)
    done = run_cli("--api", "bogus", "--", "true")
    assert done.returncode == 2 and "nccl" in done.stderr
