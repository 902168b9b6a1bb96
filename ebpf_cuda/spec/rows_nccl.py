"""NCCL's rows (libnccl.so.2, or an executable that links it statically). Their order is
their function ids: append only.
"""
from typing import Tuple

from .row import Api, Arg, Out
from .row_parts import K, N, _a, _hidden


def _in_order(*named) -> Tuple[Arg, ...]:
    """Arguments in ABI slots 0, 1, 2, ... from (name, kind) pairs (or tuples of pairs)."""
    pairs = [p for item in named for p in (item if isinstance(item[0], tuple) else (item,))]
    return tuple(_a(name, kind, slot) for slot, (name, kind) in enumerate(pairs))


_BUFFERS = (("sendbuff", K.PTR), ("recvbuff", K.PTR))  # NCCL collectives' first two
_DATATYPE = ("datatype", K.NCCL_DATATYPE)
_OP = ("op", K.NCCL_REDOP)
_COMM = ("comm", K.NCCL_COMM)
_STREAM = ("stream", K.HANDLE)


ROWS: Tuple[Api, ...] = (
    # NCCL (libnccl.so.2, nccl.h of 2.32). The ncclUniqueId of ncclCommInitRank(Config) is
    # passed by value: 128 bytes in memory, so on the stack (its first 64 read), taking no
    # register: `rank`, after it, is in the third. Each *Config collective (2.32) takes the
    # arguments of its plain form plus a config, so it is traced as that row. ncclBcast is
    # not a row: it calls ncclBroadcast, which is traced. What the communicator calls make
    # (rank, size and id of a communicator; sequence numbers): nccl.py.
    Api("ncclGetUniqueId", N, (_hidden("uniqueId", 0),), (), "communicator"),
    Api("ncclCommInitRank", N, (_a("nranks", K.INT, 1), _a("commId", K.UNIQUE_ID, 6),
                                _a("rank", K.INT, 2)), (Out("comm", K.NCCL_COMM, 0),),
        "communicator"),
    Api("ncclCommInitRankConfig", N, (_a("nranks", K.INT, 1), _a("commId", K.UNIQUE_ID, 6),
                                      _a("rank", K.INT, 2)), (Out("comm", K.NCCL_COMM, 0),),
        "communicator"),
    Api("ncclCommInitRankScalable", N, (_a("nranks", K.INT, 1), _a("rank", K.INT, 2),
                                        Arg("commId", K.UNIQUE_ID, 4, deref=64)),
        (Out("comm", K.NCCL_COMM, 0),), "communicator"),
    Api("ncclCommInitAll", N, (_hidden("comms", 0), _a("ndev", K.INT, 1),
                               _a("devlist", K.PTR, 2)), (Out("comm", K.NCCL_COMM, 0),),
        "communicator"),
    Api("ncclCommSplit", N, (_a("comm", K.NCCL_COMM, 0), _a("color", K.INT, 1),
                             _a("key", K.INT, 2), _hidden("pNewcomm", 3), _a("config", K.PTR, 4)),
        (Out("newcomm", K.NCCL_COMM, 3),), "communicator"),
    Api("ncclCommFinalize", N, (_a("comm", K.NCCL_COMM, 0),), (), "communicator"),
    Api("ncclCommDestroy", N, (_a("comm", K.NCCL_COMM, 0),), (), "communicator"),
    Api("ncclCommAbort", N, (_a("comm", K.NCCL_COMM, 0),), (), "communicator"),
    Api("ncclCommCount", N, (_a("comm", K.NCCL_COMM, 0), _hidden("pCount", 1)),
        (Out("count", K.INT, 1, size=4),), "communicator"),
    Api("ncclCommUserRank", N, (_a("comm", K.NCCL_COMM, 0), _hidden("pRank", 1)),
        (Out("rank", K.INT, 1, size=4),), "communicator"),
    Api("ncclCommCuDevice", N, (_a("comm", K.NCCL_COMM, 0), _hidden("pDevice", 1)),
        (Out("device", K.INT, 1, size=4),), "communicator"),
    Api("ncclAllReduce", N, _in_order(_BUFFERS, ("count", K.U64), _DATATYPE, _OP, _COMM,
                                      _STREAM), (), "collective", ("ncclAllReduceConfig",),
        count="count"),
    Api("ncclBroadcast", N, _in_order(_BUFFERS, ("count", K.U64), _DATATYPE, ("root", K.INT),
                                      _COMM, _STREAM), (), "collective",
        ("ncclBroadcastConfig",), count="count"),
    Api("ncclReduce", N, _in_order(_BUFFERS, ("count", K.U64), _DATATYPE, _OP,
                                   ("root", K.INT), _COMM, _STREAM), (), "collective",
        ("ncclReduceConfig",), count="count"),
    Api("ncclAllGather", N, _in_order(_BUFFERS, ("sendcount", K.U64), _DATATYPE, _COMM,
                                      _STREAM), (), "collective", ("ncclAllGatherConfig",),
        count="sendcount"),
    Api("ncclReduceScatter", N, _in_order(_BUFFERS, ("recvcount", K.U64), _DATATYPE, _OP,
                                          _COMM, _STREAM), (), "collective",
        ("ncclReduceScatterConfig",), count="recvcount"),
    # ncclAlltoAll, ncclGather, ncclScatter: NCCL 2.28 and later.
    Api("ncclAlltoAll", N, _in_order(_BUFFERS, ("count", K.U64), _DATATYPE, _COMM, _STREAM),
        (), "collective", ("ncclAlltoAllConfig",), count="count"),
    Api("ncclGather", N, _in_order(_BUFFERS, ("count", K.U64), _DATATYPE, ("root", K.INT),
                                   _COMM, _STREAM), (), "collective", ("ncclGatherConfig",),
        count="count"),
    Api("ncclScatter", N, _in_order(_BUFFERS, ("count", K.U64), _DATATYPE, ("root", K.INT),
                                    _COMM, _STREAM), (), "collective", ("ncclScatterConfig",),
        count="count"),
    Api("ncclSend", N, _in_order(("sendbuff", K.PTR), ("count", K.U64), _DATATYPE,
                                 ("peer", K.INT), _COMM, _STREAM), (), "p2p", count="count"),
    Api("ncclRecv", N, _in_order(("recvbuff", K.PTR), ("count", K.U64), _DATATYPE,
                                 ("peer", K.INT), _COMM, _STREAM), (), "p2p", count="count"),
    Api("ncclGroupStart", N, (), (), "group"),
    Api("ncclGroupEnd", N, (), (), "group"),
)
