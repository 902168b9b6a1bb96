"""Every output of one traced program agrees on what it did: text, JSON, the event summary
(`--summary` with other outputs), the in-kernel one (`--summary` alone), `--leaks`,
`--trace-out` and `--report`, live and re-read from `--save` with `ebpf-cuda report`.

The program runs through both layers at once, as PyTorch does: the layered stand-in runtime
(tests/native/fakecudart_layered.c) makes a driver call inside each runtime call, and a
second process calls the stand-in driver directly (as cuBLAS does through the runtime linked
into it). Both are traced with their real probes, through the command line only (flags and
file formats, no internals). Every operation counts once, whatever its layers:

- calls: every call of each function (the API tables list both layers' calls: they are
  distinct calls, with their own durations);
- copies and bytes per direction, memsets: a runtime call and the driver call inside it are
  one operation, a direct driver call is one too;
- launches: one per GPU launch (the default set probes the driver's launch functions only
  when the driver is probed);
- allocations, frees, double frees, leaks: as --leaks finds them.

Documented differences, checked as such: the HTML copy table has no memsets (they are no
copies); the Chrome trace follows device memory only (`live device memory`), so its leak
markers leave the leaked pinned host buffer out.
"""
import json
import re
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from ebpf_cuda.spec.apis import BY_NAME
from fakecuda_driver import build_fake_driver, build_layered_runtime
from helpers import run_cli

pytestmark = pytest.mark.kernel

# The layered runtime: (runtime op, what it does). Memory is not backed: only sizes matter.
RUNTIME_OPS = [
    "malloc:8000",  # device pointer @0 (cuMemAlloc_v2 inside)
    "malloc:1000",  # @1, never freed: a leak
    "mallochost:64",  # pinned host memory (cuMemHostAlloc inside)
    "memcpy:4000:1", "memcpy:4000:1",  # host to device (cuMemcpyHtoD_v2 inside)
    "memcpy:3000:2",  # device to host (cuMemcpyDtoH_v2 inside)
    "memcpyasync:2000:1:0x5",  # host to device, stream-ordered (cuMemcpyAsync inside)
    "memset:0:6000", "memsetasync:1:1000:0x5",  # cuMemsetD8_v2, cuMemsetD8Async inside
    "launch:2,1,1:64,1,1", "launchex:4,2,1:32,2,1:16:0x6",  # cuLaunchKernel, cuLaunchKernelEx
    "freehost",  # calls no driver function
    "free:@0", "free:@0",  # cuMemFree_v2 inside each: the second is a double free
]
# The stand-in driver, called directly.
DRIVER_OPS = [
    "init", "malloc:8192", "memsetd32:0:500",  # 500 elements of 4 bytes
    "htod:1000", "dtoh:5000", "memcpy:7000",  # cuMemcpy: direction from the pointers
    "moduleload", "getfunction:vecAdd", "launch:2,1,1:64,1,1",
    "free:@0", "free:@0",  # a double free
    "hostalloc:512",  # never freed
]

# What the two processes did, each operation once.
CALLS = {
    "cudaMalloc": 2, "cudaMallocHost": 1, "cudaMemcpy": 3, "cudaMemcpyAsync": 1,
    "cudaMemset": 1, "cudaMemsetAsync": 1, "cudaFreeHost": 1, "cudaFree": 2,
    "cuInit": 2, "cuDevicePrimaryCtxRetain": 1, "cuMemAlloc_v2": 3, "cuMemHostAlloc": 2,
    "cuMemcpyHtoD_v2": 3, "cuMemcpyDtoH_v2": 2, "cuMemcpyAsync": 1, "cuMemcpy": 1,
    "cuMemsetD8_v2": 1, "cuMemsetD8Async": 1, "cuMemsetD32_v2": 1, "cuLaunchKernel": 2,
    "cuLaunchKernelEx": 1, "cuMemFree_v2": 4, "cuModuleLoadData": 1,
    "cuModuleGetFunction": 1,
}
COPIES = {  # direction: (copies, bytes)
    "Host-to-Device": (4, 4000 + 4000 + 2000 + 1000),
    "Device-to-Host": (2, 3000 + 5000),
    "Default (unified addressing)": (1, 7000),
}
MEMSETS = (3, 6000 + 1000 + 500 * 4)
LAUNCHES = 3
ALLOCATIONS, FREES, DOUBLE_FREES = 5, 3, 2  # the double frees: one per process
LEAKS = [("cudaMalloc", 1000), ("cuMemHostAlloc", 512)]
DEVICE_LEAKS = [("cudaMalloc", 1000)]


@pytest.fixture(scope="module")
def runs(cc, tmp_path_factory) -> Dict[str, object]:
    """The program traced live three ways (every file output and --save at once; text;
    --summary alone) and its saved trace reported every way; the texts and file paths."""
    layered, driver, prog = build_layered_runtime(cc)
    _, cu_prog = build_fake_driver(cc)
    out = tmp_path_factory.mktemp("agree")
    script = out / "both_layers.sh"
    script.write_text("%s %s >/dev/null\n%s %s >/dev/null\n" % (
        prog, " ".join(RUNTIME_OPS), cu_prog, " ".join(DRIVER_OPS)))
    probe = ["-p", layered, "-p", driver]
    command = ["--", "sh", str(script)]
    saved = out / "trace.bin"
    got: Dict[str, object] = {"dir": out}
    got["live"] = _cli(*probe, "--save", saved, "--json", "-o", out / "live.jsonl",
                       "--summary", "--leaks", "--trace-out", out / "live.trace.json",
                       "--report", out / "live.html", *command)
    got["live_text"] = _cli(*probe, "-t", "-o", out / "live.txt", *command)
    got["alone"] = _cli(*probe, "--summary", *command)
    got["report_text"] = _cli("report", saved, "-t", "-o", out / "report.txt")
    got["report_json"] = _cli("report", saved, "--json", "-o", out / "report.jsonl")
    got["report"] = _cli("report", saved, "--summary", "--leaks")
    got["report_files"] = _cli("report", saved, "--trace-out", out / "report.trace.json",
                               "--report", out / "report.html")
    return got


def _cli(*args):
    done = run_cli(*args, timeout=120)
    assert done.returncode == 0, (args, done.stderr[-2000:])
    return done


# ---- reading each output -------------------------------------------------------------------

def _json_calls(path: Path) -> Counter:
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return Counter(e["api"] for e in events if e["phase"] == "exit")


def _text_calls(path: Path) -> Counter:
    # -t: PROCESS PID EVENT TYPE DETAILS
    return Counter(line.split()[2] for line in path.read_text().splitlines()
                   if line.split()[3:4] == ["[EXIT]"])


def _section(text: str, title: str) -> List[str]:
    """The rows of the table under ` ** <title>` (header and rule left out)."""
    part = text.split(" ** " + title, 1)[1].split("\n ** ", 1)[0]
    part = part.split("\n\n", 1)[1].split("\n\n", 1)[0]  # below the title, to the blank line
    return part.splitlines()[2:]


def _api_calls(text: str) -> Counter:
    """Num Calls per function of the cuda_api_sum table (event or in-kernel)."""
    return Counter({line.split()[-1]: int(line.split()[2].replace(",", ""))
                    for line in _section(text, "CUDA API Summary")})


def _memory(text: str) -> Dict[str, Tuple[int, str]]:
    """(count, MB) per operation of the memory table (event or in-kernel)."""
    return {line[line.index("["):]: (int(line.split()[1]), line.split()[0])
            for line in _section(text, "CUDA Memory Operation Summary")}


def _launches(text: str) -> int:
    return sum(int(line.split()[0]) for line in _section(text, "Kernel Launches:"))


def _leak_report(text: str) -> Tuple[int, int, List[Tuple[str, int]]]:
    """(leaks, allocations, [(allocator, size)]) of the --leaks report."""
    match = re.search(r"Leaks: (\d+) of (\d+) allocations never freed", text)
    assert match, text[-1500:]
    rows = text[match.end():].splitlines()[3:]
    leaks = sorted((r.split()[4], int(r.split()[3].replace(",", ""))) for r in rows
                   if re.match(r"\s+\d+\s+\d+\s+0x", r))
    return int(match.group(1)), int(match.group(2)), leaks


def _expected_memory() -> Dict[str, Tuple[int, str]]:
    rows = {"[CUDA memcpy %s]" % d: (n, "%.3f" % (b / 1e6)) for d, (n, b) in COPIES.items()}
    rows["[CUDA memset]"] = (MEMSETS[0], "%.3f" % (MEMSETS[1] / 1e6))
    return rows


class _Page(HTMLParser):
    """Table rows and texts of the HTML report."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.rows: List[List[str]] = []
        self.texts: List[str] = []
        self._row = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self._row = []
            self.rows.append(self._row)

    def handle_endtag(self, tag):
        if tag == "tr":
            self._row = None

    def handle_data(self, data):
        if data.strip():
            self.texts.append(data.strip())
            if self._row is not None:
                self._row.append(data.strip())

    def table(self, *header: str) -> List[List[str]]:
        """The rows of the table whose header row starts with the cells `header`."""
        start = next(i for i, r in enumerate(self.rows) if tuple(r[:len(header)]) == header)
        rows = []
        for r in self.rows[start + 1:]:
            if len(r) != len(self.rows[start]) or not r[1][:1].isdigit():
                break
            rows.append(r)
        return rows

    def number(self, label: str) -> int:
        return int(next(t for t in self.texts if t.startswith(label + ": ")).split(": ")[1])


def _trace(path: Path) -> list:
    return json.loads(path.read_text())


# ---- the checks ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["live.jsonl", "report.jsonl"])
def test_json_lists_every_call(runs, name):
    assert _json_calls(runs["dir"] / name) == CALLS


@pytest.mark.parametrize("name", ["live.txt", "report.txt"])
def test_text_lists_every_call(runs, name):
    assert _text_calls(runs["dir"] / name) == CALLS


@pytest.mark.parametrize("run", ["live", "report", "alone"])
def test_summaries_count_calls_copies_memsets_and_launches_alike(runs, run):
    text = runs[run].stdout
    assert ("in-kernel aggregates" in text) == (run == "alone")
    assert _api_calls(text) == CALLS
    assert _memory(text) == _expected_memory()
    assert _launches(text) == LAUNCHES


@pytest.mark.parametrize("run", ["live", "report"])
def test_leaks_report_allocations_frees_and_double_frees(runs, run):
    done = runs[run]
    leaks, allocations, rows = _leak_report(done.stdout)
    assert (leaks, allocations) == (len(LEAKS), ALLOCATIONS)
    assert allocations - leaks == FREES
    assert rows == sorted(LEAKS)
    warnings = [line for line in done.stderr.splitlines() if "warning: double free" in line]
    assert len(warnings) == DOUBLE_FREES, done.stderr  # warned as they happen
    assert not re.search(r"warning: (mismatched|free of an unknown)", done.stderr)


@pytest.mark.parametrize("name", ["live.html", "report.html"])
def test_html_report_counts_as_the_summary_and_the_leak_report(runs, name):
    page = _Page((runs["dir"] / name).read_text())
    calls = {r[0]: int(r[1]) for r in page.table("function")}
    assert calls == CALLS
    copies = {r[0]: (int(r[1]), int(r[2])) for r in page.table("direction")}
    assert copies == COPIES  # memsets are no copies: the page has no row for them
    assert sum(int(r[1]) for r in page.table("kernel")) == LAUNCHES
    assert (page.number("allocations"), page.number("frees"),
            page.number("double frees")) == (ALLOCATIONS, FREES, DOUBLE_FREES)
    leaked = sorted((r[3], int(r[2])) for r in page.table("pid", "pointer"))
    assert leaked == sorted(LEAKS)


@pytest.mark.parametrize("name", ["live.trace.json", "report.trace.json"])
def test_chrome_trace_has_a_slice_per_call_and_marks_device_leaks(runs, name):
    trace = _trace(runs["dir"] / name)
    slices = [e for e in trace if e["ph"] == "X"]
    # one slice per call, in its function's category (launches and the calls that learn a
    # kernel name are named after the kernel: the memory calls are compared by name)
    assert Counter(e["cat"] for e in slices) == Counter(
        {cat: sum(n for api, n in CALLS.items() if BY_NAME[api].category == cat)
         for cat in {BY_NAME[api].category for api in CALLS}})
    assert sum(1 for e in slices if e["cat"] == "launch") == LAUNCHES
    memory = ("memory", "memcpy", "memset")
    assert Counter(e["name"] for e in slices if e["cat"] in memory) == {
        api: n for api, n in CALLS.items() if BY_NAME[api].category in memory}
    leaks = sorted((e["args"]["api"], e["args"]["size"]) for e in trace
                   if e["ph"] == "i" and e["name"] == "leak")
    assert leaks == DEVICE_LEAKS  # documented: the trace follows device memory only


@pytest.mark.parametrize("name", ["live.trace.json", "report.trace.json"])
def test_chrome_trace_counts_copies_and_double_frees_once(runs, name):
    trace = _trace(runs["dir"] / name)
    copied: Dict[int, Dict[str, int]] = {}
    for e in trace:
        if e["ph"] == "C" and e["name"] == "bytes copied":
            copied[e["pid"]] = e["args"]  # running totals: the last one of each process
    totals = Counter()
    for per_pid in copied.values():
        totals.update(per_pid)
    double_frees = sum(1 for e in trace if e["ph"] == "i" and e["name"] == "double free")
    assert (dict(totals), double_frees) == (
        {d: b for d, (_n, b) in COPIES.items()}, DOUBLE_FREES)
