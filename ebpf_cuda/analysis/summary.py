"""End-of-run summaries in the shape of `nsys stats` reports, computed exactly from events.

    ** CUDA API Summary (cuda_api_sum):
     Time (%)  Total Time (ns)  Num Calls  Avg (ns)  Med (ns)  Min (ns)  Max (ns)  StdDev (ns)  Name

plus memory operations by size (cuda_gpu_mem_size_sum: sizes by copy direction), duration
percentiles per function, effective bandwidth of synchronous copies, errors by function and
code, and kernels by launch count with their geometry: each kernel a graph launch ran counts
too (its nodes, from graphs.py), and a launch a stream capture recorded into a graph counts
as captured, not as run (the table then says how many ran inside graphs, how many were
captured). Durations are those of the API calls
(host side): a kernel launch's duration is the launch call, not the kernel's run on the GPU.
Only completed calls (exit events) count. What a call is (copy, memset, launch), its
direction and bytes come from the function table's roles (operations.py); with both layers
traced each operation counts once (layers.py). With --py-stacks, a table by Python line
(python_lines.py): calls, API time, launches, bytes and sync time per innermost user frame.
"""
from collections import Counter, defaultdict
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from ..decode.events import EXIT, Event
from ..decode.operations import (MB, Geometry, copy_bytes, copy_operation, is_launch,
                                 is_synchronous_copy, launch_geometry)
from ..spec.apis import BY_NAME, Role
from ._table import decimal, integer, table
from .gpu import GpuState
from .layers import LayerFilter
from .python_lines import PythonLines
from .statistics import percentile, stats

Namer = Callable[[Event, int], Optional[str]]  # (launch event, func) → kernel name
KERNEL_NAME_WIDTH = 100  # longer kernel names are cut in the table (JSON keeps them whole)


class Summary:
    """Collects completed calls (a sink, or `add(events)` on any iterable) and renders the
    summary tables with `report()`. `namer(event, func)` names kernels (a `KernelNamer`); it
    is asked once per process and launch address, as the events arrive (while the process
    still lives). `py_stacks`: the trace has Python stacks (--py-stacks): the table by
    Python line counts every call, also those before the first with a stack (without it,
    it starts at that one: see python_lines.PythonLines)."""

    def __init__(self, namer: Optional[Namer] = None, py_stacks: bool = False) -> None:
        self.namer = namer
        self.durations: Dict[str, List[int]] = defaultdict(list)
        self.errors: Counter = Counter()  # (api, ret, ret_name) → calls
        self.copies: Dict[str, List[int]] = defaultdict(list)  # operation → sizes
        self.sync_copies: Dict[str, List[Tuple[int, int]]] = defaultdict(list)  # (bytes, ns)
        self.launches: Counter = Counter()  # (pid, func, grid, block, smem) → launches
        self.in_graphs: Counter = Counter()  # the same keys → of those, run by graph launches
        self.captured: Counter = Counter()  # the same keys → recorded into graphs, not run
        self._names: Dict[Tuple[int, int], Optional[str]] = {}
        # Both layers traced: a copy counts as its runtime call, a launch as its driver call.
        self._copy_layers = LayerFilter()
        self._launch_layers = LayerFilter()
        self._graph_layers = LayerFilter()  # cudaGraphLaunch's cuGraphLaunch: one launch
        from .collectives import CollectiveSummary

        self.collectives = CollectiveSummary()  # NCCL calls per communicator
        self.python_lines = PythonLines(py_stacks)  # --py-stacks: calls by Python line
        self.gpu = GpuState()  # the GPU's samples and events (gpu.py), when sampled

    def add(self, events: Iterable[Event]) -> None:
        """Account for completed calls; other events are ignored (but for whether they had
        a Python stack: the table by Python line is shown then)."""
        python_lines = self.python_lines
        for event in events:
            if event.py_stack is not None or event.phase == EXIT:
                python_lines.add_event(event)
            if event.phase == EXIT:
                self._add(event)

    def _add(self, event: Event) -> None:
        self.durations[event.api].append(event.duration_ns or 0)
        self.collectives.add(event)
        if event.ret:
            self.errors[(event.api, event.ret, event.ret_name)] += 1
            return
        if is_launch(event):
            if self._launch_layers.inner(event):
                self.add_launch(event.pid, event.api, event.args["func"],
                                launch_geometry(event.args), event=event,
                                captured=bool(event.outs.get("captured")))
        elif event.outs.get("nodes") and _is_graph_launch(event):
            if self._graph_layers.inner(event):
                self._graph_ran(event.pid, event.api, event.outs["nodes"])
        elif copy_operation(event) is not None:
            for copy in self._copy_layers.outer(event):
                self._copied(copy)

    def _copied(self, event: Event) -> None:
        operation = copy_operation(event)
        size = copy_bytes(event)
        if operation is not None and size is not None:
            self.copies[operation].append(size)
            if is_synchronous_copy(event):
                self.sync_copies[operation].append((size, event.duration_ns or 0))

    def add_launch(self, pid: int, api: str, func: int, geometry: Geometry, count: int = 1,
                   event: Optional[Event] = None, captured: bool = False,
                   in_graph: bool = False, name: Optional[str] = None) -> None:
        """Count `count` successful launches of kernel `func` by function `api` (one GPU
        launch through both layers counts once, as the driver launch: its kernel handle
        names every kernel, cuBLAS's and Triton's too). `captured`: recorded into a graph
        by a stream capture, not run; `in_graph`: run by a graph launch, its kernel `name`
        as the graph's node has it."""
        # (a process that exec'd runs another program: its launches are another kernel's,
        # at the same address perhaps; names.py's image tells them apart)
        image = getattr(self.namer, "image", None)
        key = (image(pid, event.ts_ns) if image is not None and event is not None else pid,
               func)
        if key not in self._names:  # (asked once: the process may be gone later)
            self._names[key] = name if in_graph else self._name(pid, api, func, event)
        elif name and not self._names[key]:
            self._names[key] = name
        counts = self.captured if captured else self.launches
        counts[key + tuple(geometry)] += count
        if in_graph:
            self.in_graphs[key + tuple(geometry)] += count

    def _graph_ran(self, pid: int, api: str, nodes: List[dict]) -> None:
        """Count the kernels of a graph launch's nodes (child graphs' too)."""
        for node in nodes:
            if node.get("type") == "kernel":
                geometry = (_dim3(node.get("grid")), _dim3(node.get("block")), node.get("smem"))
                self.add_launch(pid, api, node.get("func") or 0, geometry, in_graph=True,
                                name=node.get("kernel"))
            elif node.get("type") == "graph" and node.get("nodes"):
                self._graph_ran(pid, api, node["nodes"])

    def _name(self, pid: int, api: str, func: int, event: Optional[Event]) -> Optional[str]:
        """The kernel name: by (pid, api, func) when the namer can (KernelNamer.name_for),
        else from the launch event."""
        name_for = getattr(self.namer, "name_for", None)
        if name_for is not None and hasattr(self.namer, "image") and event is not None:
            return name_for(pid, api, func, event.ts_ns)  # (KernelNamer: that program's)
        if name_for is not None:
            return name_for(pid, api, func)
        if self.namer is None or event is None:
            return None
        return self.namer(event, func)

    # Sink protocol
    def header(self) -> None:
        """Nothing is written before the end."""

    def write(self, events: Iterable[Event]) -> None:
        events = events if isinstance(events, list) else list(events)
        self.gpu.write(events)
        self.add(events)

    def note_gpu(self, records: List) -> None:
        """The GPU's samples and events (gpu/records.py): the device and gap tables."""
        self.gpu.note_gpu(records)

    def close(self) -> None:
        """Nothing to flush: `report()` renders the tables."""

    # Rendering
    def report(self, aggregates=None) -> str:
        """Every summary table, one after the other. With in-kernel `aggregates`, the call
        tables come from those; the kernel table adds their launch counts to the launches
        of the records collected here: the graph calls' (graph launches expanded into their
        kernels) and those of the launches a process made while it captured, which the
        kernel did not count (aggregates.capturing_gate): each launch counts once."""
        if aggregates is not None:
            from .kernel_summary import aggregate_tables, launches

            for launch in launches(aggregates):
                self.add_launch(launch.pid, launch.api, launch.func, launch.geometry,
                                launch.count)
            return "\n\n".join(aggregate_tables(aggregates) + [self.kernel_table()]
                               + self._nccl_tables() + self.gpu.tables())
        return "\n\n".join([self.api_table(), self.percentile_table(), self.memory_table(),
                            self.bandwidth_table(), self.error_table(), self.kernel_table()]
                           + self._python_tables() + self._nccl_tables() + self.gpu.tables())

    def _python_tables(self) -> List[str]:
        """The table by Python line, when some event had a Python stack (--py-stacks)."""
        return [self.python_lines.table()] if self.python_lines.seen else []

    def _nccl_tables(self) -> List[str]:
        """The NCCL table, when NCCL collectives or point-to-point calls were seen."""
        return [self.collectives.table()] if self.collectives else []

    def api_table(self) -> str:
        """cuda_api_sum: time spent per function."""
        title = " ** CUDA API Summary (cuda_api_sum):\n\n"
        if not self.durations:
            return title + " (no completed calls)"
        grand = sum(sum(v) for v in self.durations.values()) or 1
        rows = []
        for name, values in self._by_total_time():
            s = stats(values)
            rows.append(("%.1f" % (100.0 * s.total / grand), integer(s.total), integer(s.count),
                         decimal(s.mean), decimal(s.median), integer(s.minimum),
                         integer(s.maximum), decimal(s.stdev), name))
        headers = ("Time (%)", "Total Time (ns)", "Num Calls", "Avg (ns)", "Med (ns)",
                   "Min (ns)", "Max (ns)", "StdDev (ns)", "Name")
        return title + table(headers, rows, left=(8,))

    def _by_total_time(self) -> List[Tuple[str, List[int]]]:
        return sorted(self.durations.items(), key=lambda item: (-sum(item[1]), item[0]))

    def percentile_table(self) -> str:
        """Duration percentiles (p50, p95, p99) per function."""
        title = " ** CUDA API Duration Percentiles:\n\n"
        if not self.durations:
            return title + " (no completed calls)"
        rows = []
        for name, values in self._by_total_time():
            ordered = sorted(values)
            rows.append((integer(len(ordered)),
                         *(decimal(percentile(ordered, p)) for p in (50, 95, 99)),
                         integer(ordered[-1]), name))
        headers = ("Num Calls", "P50 (ns)", "P95 (ns)", "P99 (ns)", "Max (ns)", "Name")
        return title + table(headers, rows, left=(5,))

    def _flush_copies(self) -> None:
        """Count the driver copies still held back (no runtime copy contained them)."""
        for copy in self._copy_layers.flush():
            self._copied(copy)

    def memory_table(self) -> str:
        """cuda_gpu_mem_size_sum: sizes of memory operations by kind (MB = 10^6 bytes)."""
        self._flush_copies()
        title = " ** CUDA Memory Operation Summary by Size (cuda_gpu_mem_size_sum):\n\n"
        if not self.copies:
            return title + " (no memory operations)"
        rows = []
        for operation, sizes in sorted(self.copies.items(),
                                       key=lambda item: (-sum(item[1]), item[0])):
            s = stats(sizes)
            rows.append((decimal(s.total / MB, 3), integer(s.count), decimal(s.mean / MB, 3),
                         decimal(s.median / MB, 3), decimal(s.minimum / MB, 3),
                         decimal(s.maximum / MB, 3), decimal(s.stdev / MB, 3), operation))
        headers = ("Total (MB)", "Count", "Avg (MB)", "Med (MB)", "Min (MB)", "Max (MB)",
                   "StdDev (MB)", "Operation")
        return title + table(headers, rows, left=(7,))

    def bandwidth_table(self) -> str:
        """Effective bandwidth of synchronous copies: bytes / call duration (GB = 10^9 B)."""
        self._flush_copies()
        title = " ** Synchronous Copy Bandwidth (bytes / call duration):\n\n"
        if not self.sync_copies:
            return title + " (no synchronous copies)"
        rows = []
        for operation, pairs in sorted(self.sync_copies.items()):
            total_bytes = sum(b for b, _ in pairs)
            total_ns = sum(ns for _, ns in pairs)
            per_call = sorted(b / ns for b, ns in pairs if ns)
            rows.append((integer(len(pairs)), decimal(total_bytes / MB, 3), integer(total_ns),
                         decimal(total_bytes / total_ns, 3) if total_ns else "-",
                         decimal(percentile(per_call, 50), 3) if per_call else "-", operation))
        headers = ("Count", "Total (MB)", "Total Time (ns)", "Bandwidth (GB/s)",
                   "Med Call (GB/s)", "Operation")
        return title + table(headers, rows, left=(5,))

    def error_table(self) -> str:
        """Failed calls by function and error code."""
        title = " ** CUDA API Errors:\n\n"
        if not self.errors:
            return title + " (no errors)"
        rows = [(integer(count), str(ret), ret_name or "?", api) for (api, ret, ret_name), count
                in sorted(self.errors.items(), key=lambda item: (-item[1], item[0][0],
                                                                  item[0][1]))]
        return title + table(("Count", "Code", "Error", "Name"), rows, left=(2, 3))

    def kernel_names(self) -> Dict[Tuple[int, int], str]:
        """Display name of each (pid, launch address): the kernel name, or the address."""
        return {key: name or "0x%x" % key[1] for key, name in self._names.items()}

    def kernel_table(self) -> str:
        """Kernels by launch count, with their geometry."""
        title = " ** Kernel Launches:\n\n"
        if not self.launches and not self.captured:
            return title + " (no kernel launches)"
        names = self.kernel_names()
        merged: Dict[tuple, List[int]] = defaultdict(lambda: [0, 0, 0])  # run, in graphs, captured
        for column, counts in enumerate((self.launches, self.in_graphs, self.captured)):
            for (pid, func, grid, block, smem), count in counts.items():
                merged[(names[(pid, func)], _dims(grid), _dims(block),
                        "-" if smem is None else integer(smem))][column] += count
        ordered = sorted(merged.items(), key=lambda item: (-item[1][0], -item[1][2], item[0]))
        if not self.in_graphs and not self.captured:  # (no graphs: the table as it was)
            rows = [(integer(n[0]), grid, block, smem, clip(name, KERNEL_NAME_WIDTH))
                    for (name, grid, block, smem), n in ordered]
            return title + table(("Launches", "Grid", "Block", "Smem (bytes)", "Kernel"), rows,
                                 left=(1, 2, 4))
        rows = [(integer(n[0]), integer(n[1]), integer(n[2]), grid, block, smem,
                 clip(name, KERNEL_NAME_WIDTH)) for (name, grid, block, smem), n in ordered]
        return title + table(("Launches", "In graphs", "Captured", "Grid", "Block",
                              "Smem (bytes)", "Kernel"), rows, left=(3, 4, 6)) + (
            "\n\n Launches: kernels run, eager or by graph launches (In graphs: of those);"
            "\n Captured: launches a stream capture recorded into a graph (not run then).")


def clip(text: str, width: int) -> str:
    """`text`, cut to `width` characters with `...` at the end when longer."""
    return text if len(text) <= width else text[:width - 3] + "..."


def _is_graph_launch(event: Event) -> bool:
    row = BY_NAME.get(event.api)
    return row is not None and row.role == Role.GRAPH_LAUNCH


def _dim3(value) -> Optional[Tuple[int, int, int]]:
    return tuple(value) if value is not None else None  # type: ignore[return-value]


def _dims(value) -> str:
    return "(%d,%d,%d)" % tuple(value) if value is not None else "-"


class SplitSummary:
    """`--summary --by-device` / `--by-container`: the summary tables once per device
    (devices.py) or container (containers.py), or per pair of both; each call counted under
    the device it targets and the container of its process. Calls whose device is not known
    (attached to a process that never set one) come under "device unknown", processes in no
    container under "no container"."""

    def __init__(self, namer: Optional[Namer] = None, by_device: bool = True,
                 by_container: bool = False, py_stacks: bool = False) -> None:
        self.namer = namer
        self.py_stacks = py_stacks
        self._fields = (("device",) if by_device else ()) + (
            ("container",) if by_container else ())
        self.parts: Dict[tuple, Summary] = {}
        self.gpu = GpuState()  # (the GPU's tables once, after every part)

    def add(self, events: Iterable[Event]) -> None:
        batches: Dict[tuple, List[Event]] = defaultdict(list)
        fields = self._fields
        for event in events:
            batches[tuple(getattr(event, f) for f in fields)].append(event)
        for key, batch in batches.items():
            summary = self.parts.get(key)
            if summary is None:
                summary = self.parts[key] = Summary(self.namer, self.py_stacks)
            summary.add(batch)

    def report(self, aggregates=None) -> str:
        """Each part's tables under its own title, in order (the unknown ones last)."""
        if not self.parts:
            return " ** (no completed calls)"
        order = sorted(self.parts, key=lambda key: [(v is None, v if v is not None else 0)
                                                    if isinstance(v, int) or v is None
                                                    else (False, v) for v in key])
        return "\n\n".join([" ==== %s ====\n\n%s" % (self._title(key),
                                                    self.parts[key].report())
                              for key in order] + self.gpu.tables())

    def _title(self, key: tuple) -> str:
        words = []
        for field, value in zip(self._fields, key):
            if field == "device":
                words.append("Device %d" % value if value is not None else "Device unknown")
            else:
                words.append("Container %s" % value if value else "No container")
        return ", ".join(words)

    def header(self) -> None:
        """Nothing is written before the end."""

    def write(self, events: Iterable[Event]) -> None:
        events = events if isinstance(events, list) else list(events)
        self.gpu.write(events)
        self.add(events)

    def note_gpu(self, records: List) -> None:
        self.gpu.note_gpu(records)

    def close(self) -> None:
        """Nothing to close."""
