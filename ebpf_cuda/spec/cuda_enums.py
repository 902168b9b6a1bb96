"""CUDA enumerations: cudaError_t, CUresult and cudaMemcpyKind (CUDA 13.0 headers; the same
values in 12.9 except CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, new in 13.0); NCCL's
ncclResult_t, ncclDataType_t and ncclRedOp_t (nccl.h of 2.32; the FP8 types are new in 2.24)."""
from typing import Dict, Optional, Union

MEMCPY_KINDS: Dict[int, str] = {
    0: "HostToHost", 1: "HostToDevice", 2: "DeviceToHost", 3: "DeviceToDevice", 4: "Default",
}

CUDA_ERRORS: Dict[int, str] = {
    0: "cudaSuccess", 1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation",
    3: "cudaErrorInitializationError", 4: "cudaErrorCudartUnloading",
    5: "cudaErrorProfilerDisabled", 6: "cudaErrorProfilerNotInitialized",
    7: "cudaErrorProfilerAlreadyStarted", 8: "cudaErrorProfilerAlreadyStopped",
    9: "cudaErrorInvalidConfiguration", 12: "cudaErrorInvalidPitchValue",
    13: "cudaErrorInvalidSymbol", 16: "cudaErrorInvalidHostPointer",
    17: "cudaErrorInvalidDevicePointer", 18: "cudaErrorInvalidTexture",
    19: "cudaErrorInvalidTextureBinding", 20: "cudaErrorInvalidChannelDescriptor",
    21: "cudaErrorInvalidMemcpyDirection", 22: "cudaErrorAddressOfConstant",
    23: "cudaErrorTextureFetchFailed", 24: "cudaErrorTextureNotBound",
    25: "cudaErrorSynchronizationError", 26: "cudaErrorInvalidFilterSetting",
    27: "cudaErrorInvalidNormSetting", 28: "cudaErrorMixedDeviceExecution",
    31: "cudaErrorNotYetImplemented", 32: "cudaErrorMemoryValueTooLarge",
    34: "cudaErrorStubLibrary", 35: "cudaErrorInsufficientDriver",
    36: "cudaErrorCallRequiresNewerDriver", 37: "cudaErrorInvalidSurface",
    43: "cudaErrorDuplicateVariableName", 44: "cudaErrorDuplicateTextureName",
    45: "cudaErrorDuplicateSurfaceName", 46: "cudaErrorDevicesUnavailable",
    49: "cudaErrorIncompatibleDriverContext", 52: "cudaErrorMissingConfiguration",
    53: "cudaErrorPriorLaunchFailure", 65: "cudaErrorLaunchMaxDepthExceeded",
    66: "cudaErrorLaunchFileScopedTex", 67: "cudaErrorLaunchFileScopedSurf",
    68: "cudaErrorSyncDepthExceeded", 69: "cudaErrorLaunchPendingCountExceeded",
    98: "cudaErrorInvalidDeviceFunction", 100: "cudaErrorNoDevice",
    101: "cudaErrorInvalidDevice", 102: "cudaErrorDeviceNotLicensed",
    103: "cudaErrorSoftwareValidityNotEstablished", 127: "cudaErrorStartupFailure",
    200: "cudaErrorInvalidKernelImage", 201: "cudaErrorDeviceUninitialized",
    205: "cudaErrorMapBufferObjectFailed", 206: "cudaErrorUnmapBufferObjectFailed",
    207: "cudaErrorArrayIsMapped", 208: "cudaErrorAlreadyMapped",
    209: "cudaErrorNoKernelImageForDevice", 210: "cudaErrorAlreadyAcquired",
    211: "cudaErrorNotMapped", 212: "cudaErrorNotMappedAsArray",
    213: "cudaErrorNotMappedAsPointer", 214: "cudaErrorECCUncorrectable",
    215: "cudaErrorUnsupportedLimit", 216: "cudaErrorDeviceAlreadyInUse",
    217: "cudaErrorPeerAccessUnsupported", 218: "cudaErrorInvalidPtx",
    219: "cudaErrorInvalidGraphicsContext", 220: "cudaErrorNvlinkUncorrectable",
    221: "cudaErrorJitCompilerNotFound", 222: "cudaErrorUnsupportedPtxVersion",
    223: "cudaErrorJitCompilationDisabled", 224: "cudaErrorUnsupportedExecAffinity",
    225: "cudaErrorUnsupportedDevSideSync", 226: "cudaErrorContained",
    300: "cudaErrorInvalidSource", 301: "cudaErrorFileNotFound",
    302: "cudaErrorSharedObjectSymbolNotFound", 303: "cudaErrorSharedObjectInitFailed",
    304: "cudaErrorOperatingSystem", 400: "cudaErrorInvalidResourceHandle",
    401: "cudaErrorIllegalState", 402: "cudaErrorLossyQuery", 500: "cudaErrorSymbolNotFound",
    600: "cudaErrorNotReady", 700: "cudaErrorIllegalAddress",
    701: "cudaErrorLaunchOutOfResources", 702: "cudaErrorLaunchTimeout",
    703: "cudaErrorLaunchIncompatibleTexturing", 704: "cudaErrorPeerAccessAlreadyEnabled",
    705: "cudaErrorPeerAccessNotEnabled", 708: "cudaErrorSetOnActiveProcess",
    709: "cudaErrorContextIsDestroyed", 710: "cudaErrorAssert", 711: "cudaErrorTooManyPeers",
    712: "cudaErrorHostMemoryAlreadyRegistered", 713: "cudaErrorHostMemoryNotRegistered",
    714: "cudaErrorHardwareStackError", 715: "cudaErrorIllegalInstruction",
    716: "cudaErrorMisalignedAddress", 717: "cudaErrorInvalidAddressSpace",
    718: "cudaErrorInvalidPc", 719: "cudaErrorLaunchFailure",
    720: "cudaErrorCooperativeLaunchTooLarge", 721: "cudaErrorTensorMemoryLeak",
    800: "cudaErrorNotPermitted", 801: "cudaErrorNotSupported", 802: "cudaErrorSystemNotReady",
    803: "cudaErrorSystemDriverMismatch", 804: "cudaErrorCompatNotSupportedOnDevice",
    805: "cudaErrorMpsConnectionFailed", 806: "cudaErrorMpsRpcFailure",
    807: "cudaErrorMpsServerNotReady", 808: "cudaErrorMpsMaxClientsReached",
    809: "cudaErrorMpsMaxConnectionsReached", 810: "cudaErrorMpsClientTerminated",
    811: "cudaErrorCdpNotSupported", 812: "cudaErrorCdpVersionMismatch",
    900: "cudaErrorStreamCaptureUnsupported", 901: "cudaErrorStreamCaptureInvalidated",
    902: "cudaErrorStreamCaptureMerge", 903: "cudaErrorStreamCaptureUnmatched",
    904: "cudaErrorStreamCaptureUnjoined", 905: "cudaErrorStreamCaptureIsolation",
    906: "cudaErrorStreamCaptureImplicit", 907: "cudaErrorCapturedEvent",
    908: "cudaErrorStreamCaptureWrongThread", 909: "cudaErrorTimeout",
    910: "cudaErrorGraphExecUpdateFailure", 911: "cudaErrorExternalDevice",
    912: "cudaErrorInvalidClusterSize", 913: "cudaErrorFunctionNotLoaded",
    914: "cudaErrorInvalidResourceType", 915: "cudaErrorInvalidResourceConfiguration",
    999: "cudaErrorUnknown", 10000: "cudaErrorApiFailureBase",
}

CU_RESULTS: Dict[int, str] = {
    0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED",
    5: "CUDA_ERROR_PROFILER_DISABLED", 6: "CUDA_ERROR_PROFILER_NOT_INITIALIZED",
    7: "CUDA_ERROR_PROFILER_ALREADY_STARTED", 8: "CUDA_ERROR_PROFILER_ALREADY_STOPPED",
    34: "CUDA_ERROR_STUB_LIBRARY", 36: "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
    46: "CUDA_ERROR_DEVICE_UNAVAILABLE", 100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE", 102: "CUDA_ERROR_DEVICE_NOT_LICENSED",
    200: "CUDA_ERROR_INVALID_IMAGE", 201: "CUDA_ERROR_INVALID_CONTEXT",
    202: "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", 205: "CUDA_ERROR_MAP_FAILED",
    206: "CUDA_ERROR_UNMAP_FAILED", 207: "CUDA_ERROR_ARRAY_IS_MAPPED",
    208: "CUDA_ERROR_ALREADY_MAPPED", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
    210: "CUDA_ERROR_ALREADY_ACQUIRED", 211: "CUDA_ERROR_NOT_MAPPED",
    212: "CUDA_ERROR_NOT_MAPPED_AS_ARRAY", 213: "CUDA_ERROR_NOT_MAPPED_AS_POINTER",
    214: "CUDA_ERROR_ECC_UNCORRECTABLE", 215: "CUDA_ERROR_UNSUPPORTED_LIMIT",
    216: "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", 217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
    218: "CUDA_ERROR_INVALID_PTX", 219: "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT",
    220: "CUDA_ERROR_NVLINK_UNCORRECTABLE", 221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
    222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", 223: "CUDA_ERROR_JIT_COMPILATION_DISABLED",
    224: "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", 225: "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC",
    226: "CUDA_ERROR_CONTAINED", 300: "CUDA_ERROR_INVALID_SOURCE",
    301: "CUDA_ERROR_FILE_NOT_FOUND", 302: "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND",
    303: "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", 304: "CUDA_ERROR_OPERATING_SYSTEM",
    400: "CUDA_ERROR_INVALID_HANDLE", 401: "CUDA_ERROR_ILLEGAL_STATE",
    402: "CUDA_ERROR_LOSSY_QUERY", 500: "CUDA_ERROR_NOT_FOUND", 600: "CUDA_ERROR_NOT_READY",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS", 701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT", 703: "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING",
    704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", 705: "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
    708: "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", 709: "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    710: "CUDA_ERROR_ASSERT", 711: "CUDA_ERROR_TOO_MANY_PEERS",
    712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
    713: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", 714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
    715: "CUDA_ERROR_ILLEGAL_INSTRUCTION", 716: "CUDA_ERROR_MISALIGNED_ADDRESS",
    717: "CUDA_ERROR_INVALID_ADDRESS_SPACE", 718: "CUDA_ERROR_INVALID_PC",
    719: "CUDA_ERROR_LAUNCH_FAILED", 720: "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
    721: "CUDA_ERROR_TENSOR_MEMORY_LEAK", 800: "CUDA_ERROR_NOT_PERMITTED",
    801: "CUDA_ERROR_NOT_SUPPORTED", 802: "CUDA_ERROR_SYSTEM_NOT_READY",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", 804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    805: "CUDA_ERROR_MPS_CONNECTION_FAILED", 806: "CUDA_ERROR_MPS_RPC_FAILURE",
    807: "CUDA_ERROR_MPS_SERVER_NOT_READY", 808: "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
    809: "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", 810: "CUDA_ERROR_MPS_CLIENT_TERMINATED",
    811: "CUDA_ERROR_CDP_NOT_SUPPORTED", 812: "CUDA_ERROR_CDP_VERSION_MISMATCH",
    900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", 901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
    902: "CUDA_ERROR_STREAM_CAPTURE_MERGE", 903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
    904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", 905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
    906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", 907: "CUDA_ERROR_CAPTURED_EVENT",
    908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", 909: "CUDA_ERROR_TIMEOUT",
    910: "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", 911: "CUDA_ERROR_EXTERNAL_DEVICE",
    912: "CUDA_ERROR_INVALID_CLUSTER_SIZE", 913: "CUDA_ERROR_FUNCTION_NOT_LOADED",
    914: "CUDA_ERROR_INVALID_RESOURCE_TYPE", 915: "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
    916: "CUDA_ERROR_KEY_ROTATION", 999: "CUDA_ERROR_UNKNOWN",
}


NCCL_RESULTS: Dict[int, str] = {
    0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError",
    3: "ncclInternalError", 4: "ncclInvalidArgument", 5: "ncclInvalidUsage",
    6: "ncclRemoteError", 7: "ncclInProgress", 8: "ncclTimeout",
}

# ncclDataType_t: name and element size in bytes.
NCCL_DATATYPES: Dict[int, str] = {
    0: "ncclInt8", 1: "ncclUint8", 2: "ncclInt32", 3: "ncclUint32", 4: "ncclInt64",
    5: "ncclUint64", 6: "ncclFloat16", 7: "ncclFloat32", 8: "ncclFloat64", 9: "ncclBfloat16",
    10: "ncclFloat8e4m3", 11: "ncclFloat8e5m2",
}
NCCL_TYPE_SIZES: Dict[int, int] = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2,
                                   10: 1, 11: 1}

# ncclRedOp_t: the built-in operations (5 and up are made by ncclRedOpCreatePreMulSum).
NCCL_REDOPS: Dict[int, str] = {0: "ncclSum", 1: "ncclProd", 2: "ncclMax", 3: "ncclMin",
                               4: "ncclAvg"}

# Each library's result type: its names, and how an unknown code is shown.
_RESULTS = {"runtime": (CUDA_ERRORS, "cudaError(%d)"), "driver": (CU_RESULTS, "CUresult(%d)"),
            "nccl": (NCCL_RESULTS, "ncclResult(%d)")}


def error_name(code: int, library: Union[bool, str] = False) -> str:
    """Name of a result of a function of `library` (apis.RUNTIME: cudaError_t, DRIVER:
    CUresult, NCCL: ncclResult_t; True and False stand for driver and runtime); unknown
    codes stay numeric."""
    if isinstance(library, bool):
        library = "driver" if library else "runtime"
    table, unknown = _RESULTS[library]
    return table.get(code, unknown % code)


def nccl_datatype_name(datatype: int) -> str:
    """`ncclFloat32` for 7, ...; unknown types stay numeric."""
    return NCCL_DATATYPES.get(datatype, "ncclDataType(%d)" % datatype)


def nccl_bytes(count: int, datatype: int) -> Optional[int]:
    """count elements of `datatype` in bytes (None for an unknown type)."""
    size = NCCL_TYPE_SIZES.get(datatype)
    return None if size is None else count * size


def nccl_redop_name(op: int) -> str:
    """`ncclSum` for 0, ...; an operation made by ncclRedOpCreatePreMulSum stays numeric."""
    return NCCL_REDOPS.get(op, "ncclRedOp(%d)" % op)


def memcpy_kind_name(kind: int) -> str:
    """`HostToDevice` for 1, ...; unknown kinds stay numeric."""
    return MEMCPY_KINDS.get(kind, "kind(%d)" % kind)
