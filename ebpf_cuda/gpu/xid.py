"""The Xid catalogue: what each driver error code means, as NVIDIA's "Xid Errors" page tells
(docs.nvidia.com/deploy/xid-errors), one table. An Xid the table lacks is named by its
number alone."""
from typing import Dict

XIDS: Dict[int, str] = {
    8: "GPU stopped processing (timeout)",
    13: "Graphics engine exception (often an illegal memory access or out-of-range index)",
    31: "GPU memory page fault (an illegal address accessed by the application)",
    32: "Invalid or corrupted push buffer stream",
    38: "Driver firmware error",
    43: "GPU stopped processing (the application's channel was reset)",
    45: "Preemptive cleanup, due to previous errors (the process ended or was killed)",
    48: "Double-bit ECC error (uncorrectable memory error)",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping recording failed",
    68: "Video processor (NVDEC) exception",
    69: "Graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error (the affected application must restart)",
    95: "Uncontained ECC error (every application on the GPU is affected; reset the GPU)",
    109: "Context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    121: "C2C link corrected error",
    140: "Unrecovered ECC error",
    154: "GPU recovery action changed",
}


def meaning(code: int) -> str:
    """The catalogue's words for an Xid code."""
    return XIDS.get(code, "Xid %d (not in the catalogue)" % code)
