"""The monitor's metric families, made from what its reader published (series.LaunchSeries)
and the small maps a scrape reads (errors, losses): names, help texts, units and labels.
"""
from typing import Dict, List, Optional, Sequence, Tuple

from ..decode.aggregates import FunctionTotals
from ..spec.apis import FN_ID, TABLE, Api, Role
from ..spec.cuda_enums import error_name, memcpy_kind_name
from .metrics import Family, Labels, histogram

GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")  # the rows that launch a graph


def function_families(functions: Sequence[FunctionTotals]) -> List[Family]:
    """Calls, durations, bytes and graph launches per function (and layer, copy kind)."""
    calls: Dict[Labels, int] = {}
    hists: Dict[Labels, List[int]] = {}
    sums: Dict[Labels, int] = {}
    graphs: Dict[Labels, int] = {}
    moved: Dict[str, Dict[Labels, int]] = {Role.COPY: {}, Role.MEMSET: {}, Role.ALLOC: {}}
    for f in functions:
        labels = (("api", f.api.name), ("layer", f.api.library))
        calls[labels] = calls.get(labels, 0) + f.count
        sums[labels] = sums.get(labels, 0) + f.total_ns
        hist = hists.setdefault(labels, [0] * len(f.histogram))
        hists[labels] = [a + b for a, b in zip(hist, f.histogram)]
        if f.api.name in GRAPH_LAUNCHES:
            graphs[labels] = graphs.get(labels, 0) + f.count - f.errors
        if f.api.role in moved and f.bytes:
            key = labels + ((("kind", copy_kind(f.api, f.kind)),)
                            if f.api.role == Role.COPY else ())
            moved[f.api.role][key] = moved[f.api.role].get(key, 0) + f.bytes
    return [
        Family("ebpf_cuda_api_calls", "counter", "CUDA API calls, failed ones included.",
               "1", sorted(calls.items())),
        Family("ebpf_cuda_api_duration_seconds", "histogram",
               "CUDA API call durations (log2 buckets of the kernel: bounds are powers of "
               "two of nanoseconds).", "s",
               [(labels, histogram(hists[labels], sums[labels], sum(hists[labels])))
                for labels in sorted(hists)]),
        Family("ebpf_cuda_memcpy_bytes", "counter",
               "Bytes of successful copies, by direction (kind).", "By",
               sorted(moved[Role.COPY].items())),
        Family("ebpf_cuda_memset_bytes", "counter", "Bytes of successful memsets.", "By",
               sorted(moved[Role.MEMSET].items())),
        Family("ebpf_cuda_alloc_bytes", "counter", "Bytes of successful allocations.", "By",
               sorted(moved[Role.ALLOC].items())),
        Family("ebpf_cuda_graph_launches", "counter", "Successful CUDA graph launches.", "1",
               sorted(graphs.items())),
    ]


def copy_kind(api: Api, kind: Optional[int]) -> str:
    """A copy's direction: its memcpy kind argument's name, or the row's fixed direction."""
    if kind is not None:
        return memcpy_kind_name(kind)
    return api.direction or "Default"


def _function_key(row: Tuple[str, str, list]) -> Tuple[str, str]:
    return row[0], row[1]


def process_families(per_process: Dict[Tuple[Labels, int], list]) -> List[Family]:
    """Calls, errors and API time by process and function (a process's series go with its
    launch series, once every exporter has collected its last values)."""
    by_process: Dict[Labels, List[Tuple[str, str, list]]] = {}
    for (labels, fn_id), values in per_process.items():
        by_process.setdefault(labels, []).append((TABLE[fn_id].name, TABLE[fn_id].library,
                                                  values))
    # (sorted by process, then function: the processes' labels compared once each)
    rows = [(labels + (("api", name), ("layer", library)), values)
            for labels in sorted(by_process)
            for name, library, values in sorted(by_process[labels], key=_function_key)]
    return [
        Family("ebpf_cuda_process_api_calls", "counter",
               "CUDA API calls by process, failed ones included (the functions of "
               "ebpf_cuda_api_return_sampling: their launches, counted at entry).", "1",
               [(labels, v[0]) for labels, v in rows]),
        Family("ebpf_cuda_process_api_errors", "counter",
               "Failed CUDA API calls by process (the functions of "
               "ebpf_cuda_api_return_sampling: none).", "1",
               [(labels, v[1]) for labels, v in rows if v[1] is not None]),
        Family("ebpf_cuda_process_api_seconds", "counter",
               "Time spent in CUDA API calls by process (the functions of "
               "ebpf_cuda_api_return_sampling: none).", "s",
               [(labels, v[2] / 1e9) for labels, v in rows if v[2] is not None]),
    ]


def error_family(errors: Dict[Tuple[int, int], int]) -> Family:
    """Failed calls by function and error, from (fn_id, code) -> count."""
    counts: Dict[Labels, int] = {}
    for (fn_id, code), n in errors.items():
        api = TABLE[fn_id]
        labels = (("api", api.name), ("layer", api.library),
                  ("error", error_name(code, api.driver)))
        counts[labels] = counts.get(labels, 0) + n
    return Family("ebpf_cuda_api_errors", "counter", "Failed CUDA API calls by error.", "1",
                  sorted(counts.items()))


def sampling_family(sampled: Sequence[str], one_in: int) -> Family:
    """The functions whose returns are sampled, 1 call in `one_in`."""
    return Family(
        "ebpf_cuda_api_return_sampling", "gauge",
        "Functions whose returns are sampled, 1 call in the value (uprobe sessions): "
        "their durations and errors are those of the sampled calls; their calls, and "
        "their kernel launches (failed ones included), are all counted.", "1",
        [((("api", api), ("layer", TABLE[FN_ID[api]].library)), one_in) for api in sampled])


def launch_family(launches: Dict[Tuple[Labels, str, str], int]) -> Family:
    """Launches by (process labels, api, kernel label)."""
    return Family(
        "ebpf_cuda_kernel_launches", "counter",
        "Kernel launches by process and kernel (the first N kernels of a process by "
        "name, the rest as kernel=\"other\"): the successful ones, or for the functions "
        "of ebpf_cuda_api_return_sampling every attempt.", "1",
        [(labels + (("api", api), ("layer", TABLE[FN_ID[api]].library),
                    ("kernel", kernel)), n)
         for (labels, api, kernel), n in sorted(launches.items())])


def lost_family(lost: Sequence[Tuple[str, int]]) -> Family:
    """What could not be counted or kept, by cause."""
    return Family("ebpf_cuda_events_lost", "counter",
                  "What the probes could not count or keep, by cause: ring_full (records "
                  "of name-teaching calls, or with a flight recorder every call's), "
                  "too_deep (calls not counted: their entry could not be kept), "
                  "launch_map_full (launches counted "
                  "but not by process), process_map_full (calls counted but not by "
                  "process), name_map_full (kernel names gone from the probes' names "
                  "map before the reader read their registrations, and in no file), "
                  "name_unreadable (kernel names the probe could not read, in no file), "
                  "flight_recorder_full (calls overwritten in the "
                  "flight recorder before they were SECONDS old), "
                  "flight_recorder_unwritten (calls its disk refused), notice_ring_full "
                  "(notices of dlopens and execs: every process is scanned again).", "1",
                  [((("cause", cause),), n) for cause, n in lost])


def processes_family(running: int) -> Family:
    return Family("ebpf_cuda_processes", "gauge",
                  "Processes seen making CUDA calls that still run.", "1", [((), running)])


def files_family(start: int, late: int, detached: int) -> Family:
    """The CUDA files probed, by state."""
    return Family("ebpf_cuda_probed_files", "gauge",
                  "CUDA files probed, by state: start (found at the start, probed until "
                  "the monitor stops), late (probed after the start, probes on now), "
                  "detached (probed late, then detached once no process mapped them: so "
                  "far; a file mapped again is probed again).", "1",
                  [((("state", "start"),), start),
                   ((("state", "late"),), late), ((("state", "detached"),), detached)])


def memory_family(memory: Sequence[Tuple[Labels, int]]) -> Family:
    return Family(
        "ebpf_cuda_device_memory_bytes", "gauge",
        "Device memory each running process holds: what its traced allocations returned "
        "and its frees have not released (allocations made before the monitor started "
        "are not known).", "By", list(memory))
