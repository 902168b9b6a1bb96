"""The CUDA graph rows of the runtime and the driver (graphs.py builds graphs from their
calls). They come after every other row so that earlier rows kept their ids: append only.
"""
from typing import Tuple

from .row import Api, Arg, Out, Role
from .row_parts import D, K, R, _a, _hidden


def _node_args(*rest: Arg) -> Tuple[Arg, ...]:
    """cudaGraphAdd*Node and cuGraphAdd*Node: the new node (out), its graph, its
    dependencies (not read: nodes are kept in the order added, a topological one) and their
    count, then `rest` (from slot 4)."""
    return (_hidden("pGraphNode", 0), _a("graph", K.HANDLE, 1),
            _a("numDependencies", K.U64, 3)) + rest


_NODE = (Out("node", K.HANDLE, 0),)
_KERNEL_PARAMS = Arg("params", K.KERNEL_NODE, 4, deref=40)  # func .. sharedMemBytes
_MEMSET_PARAMS = Arg("params", K.MEMSET_NODE, 4, deref=40)  # dst .. height
_EXEC = (Out("graphExec", K.HANDLE, 0),)
_CAPTURE_TO_GRAPH = (_a("stream", K.HANDLE, 0), _a("graph", K.HANDLE, 1),
                     _a("numDependencies", K.U64, 4), _a("mode", K.INT, 5))
_CAPTURE_MODE = (Arg("mode", K.INT, 0, deref=4),)  # in and out: the previous mode at return


ROWS: Tuple[Api, ...] = (
    # CUDA graphs (graphs.py), after the rest so that earlier rows keep their ids. The
    # runtime's rows (libcudart 12 and 13 export them all)...
    Api("cudaStreamBeginCaptureToGraph", R, _CAPTURE_TO_GRAPH, (), "graph",
        ("cudaStreamBeginCaptureToGraph_ptsz",), role=Role.CAPTURE_BEGIN),
    Api("cudaThreadExchangeStreamCaptureMode", R, _CAPTURE_MODE,
        (Out("previous", K.INT, 0, size=4),), "graph"),
    Api("cudaGraphCreate", R, (_hidden("pGraph", 0), _a("flags", K.UINT, 1)),
        (Out("graph", K.HANDLE, 0),), "graph", role=Role.GRAPH_CREATE),
    Api("cudaGraphAddKernelNode", R, _node_args(_KERNEL_PARAMS), _NODE, "graph",
        role=Role.KERNEL_NODE),
    # cudaMemcpy3DParms: extent at 128 (width in bytes for linear memory), kind at 152.
    Api("cudaGraphAddMemcpyNode", R, _node_args(
        Arg("extent", K.EXTENT, 4, deref=24, deref_at=128),
        Arg("kind", K.MEMCPY_KIND, 4, deref=4, deref_at=152)), _NODE, "graph",
        role=Role.COPY_NODE),
    Api("cudaGraphAddMemcpyNode1D", R, _node_args(
        _a("dst", K.PTR, 4), _a("src", K.PTR, 5), _a("size", K.SIZE, 6),
        _a("kind", K.MEMCPY_KIND, 7)), _NODE, "graph", role=Role.COPY_NODE),
    Api("cudaGraphAddMemcpyNodeToSymbol", R, _node_args(
        _a("symbol", K.PTR, 4), _a("src", K.PTR, 5), _a("size", K.SIZE, 6),
        _a("offset", K.U64, 7), _a("kind", K.MEMCPY_KIND, 8)), _NODE, "graph",
        role=Role.COPY_NODE),
    Api("cudaGraphAddMemcpyNodeFromSymbol", R, _node_args(
        _a("dst", K.PTR, 4), _a("symbol", K.PTR, 5), _a("size", K.SIZE, 6),
        _a("offset", K.U64, 7), _a("kind", K.MEMCPY_KIND, 8)), _NODE, "graph",
        role=Role.COPY_NODE),
    Api("cudaGraphAddMemsetNode", R, _node_args(_MEMSET_PARAMS), _NODE, "graph",
        role=Role.MEMSET_NODE),
    Api("cudaGraphAddChildGraphNode", R, _node_args(_a("childGraph", K.HANDLE, 4)), _NODE,
        "graph", role=Role.CHILD_NODE),
    Api("cudaGraphAddEmptyNode", R, _node_args(), _NODE, "graph", role=Role.EMPTY_NODE),
    Api("cudaGraphAddEventRecordNode", R, _node_args(_a("event", K.HANDLE, 4)), _NODE,
        "graph", role=Role.EMPTY_NODE),
    Api("cudaGraphAddEventWaitNode", R, _node_args(_a("event", K.HANDLE, 4)), _NODE,
        "graph", role=Role.EMPTY_NODE),
    Api("cudaGraphInstantiateWithFlags", R, (_hidden("pGraphExec", 0),
                                             _a("graph", K.HANDLE, 1), _a("flags", K.U64, 2)),
        _EXEC, "graph", role=Role.INSTANTIATE),
    Api("cudaGraphInstantiateWithParams", R, (_hidden("pGraphExec", 0),
                                              _a("graph", K.HANDLE, 1), _a("params", K.PTR, 2)),
        _EXEC, "graph", ("cudaGraphInstantiateWithParams_ptsz",), role=Role.INSTANTIATE),
    Api("cudaGraphExecKernelNodeSetParams", R, (_a("graphExec", K.HANDLE, 0),
                                                _a("node", K.HANDLE, 1),
                                                Arg("params", K.KERNEL_NODE, 2, deref=40)),
        (), "graph", role=Role.EXEC_KERNEL_UPDATE),
    Api("cudaGraphExecUpdate", R, (_a("graphExec", K.HANDLE, 0), _a("graph", K.HANDLE, 1)),
        (), "graph", role=Role.EXEC_UPDATE),
    Api("cudaGraphDestroy", R, (_a("graph", K.HANDLE, 0),), (), "graph",
        role=Role.GRAPH_DESTROY),
    Api("cudaGraphExecDestroy", R, (_a("graphExec", K.HANDLE, 0),), (), "graph",
        role=Role.EXEC_DESTROY),
    # ... and the driver's (the names cuda.h maps to in CUDA 12 and 13).
    Api("cuStreamBeginCapture_v2", D, (_a("stream", K.HANDLE, 0), _a("mode", K.INT, 1)), (),
        "graph", ("cuStreamBeginCapture_v2_ptsz",), role=Role.CAPTURE_BEGIN),
    Api("cuStreamBeginCaptureToGraph", D, _CAPTURE_TO_GRAPH, (), "graph",
        ("cuStreamBeginCaptureToGraph_ptsz",), role=Role.CAPTURE_BEGIN),
    Api("cuStreamEndCapture", D, (_a("stream", K.HANDLE, 0), _hidden("phGraph", 1)),
        (Out("graph", K.HANDLE, 1),), "graph", ("cuStreamEndCapture_ptsz",),
        role=Role.CAPTURE_END),
    Api("cuThreadExchangeStreamCaptureMode", D, _CAPTURE_MODE,
        (Out("previous", K.INT, 0, size=4),), "graph"),
    Api("cuGraphCreate", D, (_hidden("phGraph", 0), _a("flags", K.UINT, 1)),
        (Out("graph", K.HANDLE, 0),), "graph", role=Role.GRAPH_CREATE),
    Api("cuGraphAddKernelNode_v2", D, _node_args(_KERNEL_PARAMS), _NODE, "graph",
        role=Role.KERNEL_NODE),
    # CUDA_MEMCPY3D: srcMemoryType at 32, dstMemoryType at 120, WidthInBytes/Height/Depth
    # at 176.
    Api("cuGraphAddMemcpyNode", D, _node_args(
        Arg("srcMemoryType", K.MEMORY_TYPE, 4, deref=4, deref_at=32),
        Arg("dstMemoryType", K.MEMORY_TYPE, 4, deref=4, deref_at=120),
        Arg("extent", K.EXTENT, 4, deref=24, deref_at=176)), _NODE, "graph",
        role=Role.COPY_NODE),
    Api("cuGraphAddMemsetNode", D, _node_args(_MEMSET_PARAMS), _NODE, "graph",
        role=Role.MEMSET_NODE),
    Api("cuGraphAddChildGraphNode", D, _node_args(_a("childGraph", K.HANDLE, 4)), _NODE,
        "graph", role=Role.CHILD_NODE),
    Api("cuGraphAddEmptyNode", D, _node_args(), _NODE, "graph", role=Role.EMPTY_NODE),
    Api("cuGraphAddEventRecordNode", D, _node_args(_a("event", K.HANDLE, 4)), _NODE,
        "graph", role=Role.EMPTY_NODE),
    Api("cuGraphAddEventWaitNode", D, _node_args(_a("event", K.HANDLE, 4)), _NODE,
        "graph", role=Role.EMPTY_NODE),
    Api("cuGraphInstantiateWithFlags", D, (_hidden("phGraphExec", 0),
                                           _a("graph", K.HANDLE, 1), _a("flags", K.U64, 2)),
        _EXEC, "graph", role=Role.INSTANTIATE),
    # (CUDA 11's form: its error node, log buffer and size are not read)
    Api("cuGraphInstantiate_v2", D, (_hidden("phGraphExec", 0), _a("graph", K.HANDLE, 1)),
        _EXEC, "graph", role=Role.INSTANTIATE),
    Api("cuGraphInstantiateWithParams", D, (_hidden("phGraphExec", 0),
                                            _a("graph", K.HANDLE, 1), _a("params", K.PTR, 2)),
        _EXEC, "graph", ("cuGraphInstantiateWithParams_ptsz",), role=Role.INSTANTIATE),
    Api("cuGraphExecKernelNodeSetParams_v2", D, (_a("graphExec", K.HANDLE, 0),
                                                 _a("node", K.HANDLE, 1),
                                                 Arg("params", K.KERNEL_NODE, 2, deref=40)),
        (), "graph", role=Role.EXEC_KERNEL_UPDATE),
    Api("cuGraphExecUpdate_v2", D, (_a("graphExec", K.HANDLE, 0), _a("graph", K.HANDLE, 1)),
        (), "graph", role=Role.EXEC_UPDATE),
    Api("cuGraphDestroy", D, (_a("graph", K.HANDLE, 0),), (), "graph",
        role=Role.GRAPH_DESTROY),
    Api("cuGraphExecDestroy", D, (_a("graphExec", K.HANDLE, 0),), (), "graph",
        role=Role.EXEC_DESTROY),
)
