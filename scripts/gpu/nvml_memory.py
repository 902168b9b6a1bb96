"""What the GPU's state costs the monitor's memory, step by step, in one fresh process (issue
37's follow-up: D35's monitor went from 32.1 MB idle to 54.8 MB with NVML).

    python3 scripts/gpu/nvml_memory.py [--nvml PATH] [--rounds N] [--out DIR]

Needs no root, no probe and no GPU framework: the monitor's GPU part (monitor/dcgm.GpuState)
alone, as the monitor runs it. Steps, each measured after the one before (VmRSS, RssAnon,
RssFile, threads, and the resident KiB by mapping: NVML's library file, the other files, the
heap, anonymous mappings, thread stacks):

- `base`: the monitor's own modules imported (monitor/agent.py), its allocator set as the
  monitor's command sets it (monitor/heap.for_long_runs);
- `imported`: the GPU part's modules imported (monitor/dcgm.py and what it brings);
- `loaded`: libnvidia-ml.so.1 loaded (dlopen, no call);
- NVML called here, one kind of call at a time: `initialised` (nvmlInit_v2), `devices`
  (handles, names, UUIDs, MIG mode), `device_values` (utilisation, memory, power, clocks,
  PCIe, ECC, NVLink), `processes` (their memory and utilisation), `gpm` (two GPM samples
  and the metrics between them, where the device has GPM);
- `sampling`: the monitor's GPU part started (monitor/dcgm.GpuState at 10 Hz: the sampler's,
  its worker's and the event thread's threads) and its first round taken;
- `trimmed`: glibc's free pages handed back (monitor/heap.trim, as the monitor does after
  the first round): what NVML's initialisation allocated and freed;
- `rounds`: after N more rounds (growth here is a leak);
- `scrapes`: after 100 renderings of the families (what scrapes add).

A second pass (a child, under tracemalloc) gives the Python-side bytes each step allocated
and kept, and where (the top lines). A third child measures the smallest process that can
hold NVML (python3, ctypes, nvmlInit_v2 and one device's utilisation): what sampling NVML in
a small child process of its own would cost instead.

Prints INFO lines; writes DIR/nvml_memory.jsonl (DIR: --out, else $OUT, else .). Exit 77 when
there is no NVML (SKIP).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucheck  # noqa: E402

V = gpucheck.Verdicts("nvml-memory")
NVML_NAME = "libnvidia-ml"


def memory(pid: str = "self") -> dict:
    """VmRSS, RssAnon, RssFile, Threads (KiB, count) and the resident KiB by kind of
    mapping."""
    with open("/proc/%s/status" % pid) as f:
        status = f.read()
    found = {key: int(re.search(key + r":\s+(\d+)", status).group(1))
             for key in ("VmRSS", "RssAnon", "RssFile", "Threads")}
    split = {"nvml_library": 0, "other_files": 0, "heap": 0, "stacks": 0, "anon": 0,
             "other": 0}
    name = ""
    with open("/proc/%s/smaps" % pid) as f:
        for line in f:
            if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
                fields = line.split()
                name = fields[5] if len(fields) > 5 else ""
            elif line.startswith("Rss:"):
                split[_kind(name)] += int(line.split()[1])
    found["by_mapping"] = split
    return found


def _kind(name: str) -> str:
    if NVML_NAME in name:
        return "nvml_library"
    if name.startswith("/"):
        return "other_files"
    if name == "[heap]":
        return "heap"
    if name.startswith("[stack"):
        return "stacks"
    return "anon" if not name else "other"


def _wait(what, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _each_device(lib, handles, reads) -> None:
    """Each read on each device; an NVML error is the driver's answer, not this script's."""
    from ebpf_cuda.gpu import nvml

    for handle in handles:
        for read in reads:
            try:
                read(handle)
            except nvml.NvmlError:
                pass


def _direct_steps(lib, record) -> None:
    """NVML's own steps, called here one kind at a time (the monitor's sampler makes the
    same calls): which of them costs memory."""
    from ebpf_cuda.gpu import nvml
    from ebpf_cuda.gpu.sampler import GPM_METRICS

    lib.init()  # (NVML counts its initialisations: the sampler's is a second one)
    record("initialised")
    handles = [lib.handle(i) for i in range(lib.device_count())]
    _each_device(lib, handles, (lib.name, lib.uuid, lib.mig_mode))
    record("devices")
    _each_device(lib, handles, (
        lib.utilization, lib.memory, lib.power_mw, lib.temperature, lib.clock_reasons,
        lib.pcie, lib.ecc, lib.nvlink_kib, lambda h: lib.clock(h, nvml.CLOCK_SM)))
    record("device_values")
    _each_device(lib, handles, (lib.processes, lambda h: lib.process_utilization(h, 0)))
    record("processes")

    def gpm(handle):
        if lib.gpm_supported(handle):
            first, second = lib.gpm_alloc(), lib.gpm_alloc()
            lib.gpm_sample(handle, first)
            time.sleep(0.1)
            lib.gpm_sample(handle, second)
            lib.gpm_metrics(first, second, list(GPM_METRICS))

    _each_device(lib, handles, (gpm,))
    record("gpm")


def steps(path, rounds: int, record):
    """Take the steps of the module's docstring; `record(step)` after each."""
    import importlib

    importlib.import_module("ebpf_cuda.monitor.agent")  # (the monitor's own modules)
    from ebpf_cuda.monitor import heap

    heap.for_long_runs()  # (as the monitor's command sets its allocator)
    record("base")
    from ebpf_cuda.gpu import nvml
    from ebpf_cuda.monitor.dcgm import GpuState

    record("imported")
    try:
        lib = nvml.Nvml(path)  # (the sampler loads it again: the loader hands back this one)
        record("loaded")
        _direct_steps(lib, record)
    except nvml.NvmlError as err:
        return str(err)
    said = []
    state = GpuState(0.1, path, notice=said.append)
    if not state.start() or not _wait(lambda: state.sampler.rounds >= 1 or
                                      state.sampler.stopped is not None):
        return "the sampler did not start: %s" % said
    if state.sampler.stopped is not None:
        return state.sampler.stopped
    record("sampling")
    heap.trim()  # (the monitor does, after the GPU's first round)
    record("trimmed")
    _wait(lambda: state.sampler.rounds >= 1 + rounds, 10 + rounds)
    record("rounds")
    for _ in range(100):
        state.families(lambda pid: (("pid", str(pid)),))
    record("scrapes")
    state.close()
    return None


def measure(path, rounds: int) -> dict:
    """The steps' memory in this process."""
    seen = {}

    def record(step):
        time.sleep(0.3)  # (a thread just started settles)
        seen[step] = memory()

    why = steps(path, rounds, record)
    return {"steps": seen, "not_sampled": why}


def measure_python(path, rounds: int) -> dict:
    """The steps' Python-side allocations (tracemalloc): bytes kept after each, and the top
    lines of the whole GPU part."""
    import tracemalloc

    tracemalloc.start(1)
    kept, first = {}, []

    def record(step):
        time.sleep(0.3)
        snapshot = tracemalloc.take_snapshot()
        kept[step] = sum(stat.size for stat in snapshot.statistics("filename"))
        if step == "base":
            first.append(snapshot)

    why = steps(path, rounds, record)
    top = []
    if first:
        diff = tracemalloc.take_snapshot().compare_to(first[0], "lineno")
        top = ["%s:%d %+d B" % (s.traceback[0].filename.split("ebpf_cuda/")[-1],
                                s.traceback[0].lineno, s.size_diff) for s in diff
               if "tracemalloc" not in s.traceback[0].filename][:12]
    return {"python_bytes": kept, "top": top, "not_sampled": why}


SMALLEST = r"""
import ctypes, json, re, sys
lib = ctypes.CDLL(sys.argv[1] if len(sys.argv) > 1 else "libnvidia-ml.so.1")
def rss():
    return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read()).group(1))
before = rss()
ok = lib.nvmlInit_v2() == 0
handle, util = ctypes.c_void_p(), (ctypes.c_uint * 2)()
ok = ok and lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == 0
ok = ok and lib.nvmlDeviceGetUtilizationRates(handle, util) == 0
print(json.dumps({"python_alone_kib": before, "with_nvml_kib": rss(), "ok": ok}))
"""


def child(args, *more) -> dict:
    done = subprocess.run([sys.executable, os.path.abspath(__file__), *more,
                           "--rounds", str(args.rounds)] +
                          (["--nvml", args.nvml] if args.nvml else []),
                          capture_output=True, text=True, timeout=300)
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": gpucheck.tail(done.stderr)}
    return json.loads(lines[-1])


def report(rss: dict, python: dict, smallest: dict) -> None:
    steps_seen = rss["steps"]
    names = list(steps_seen)
    for before, after in zip(names, names[1:]):
        a, b = steps_seen[before], steps_seen[after]
        split = {k: b["by_mapping"][k] - a["by_mapping"][k] for k in b["by_mapping"]}
        grown = ", ".join("%s %+d" % (k, v) for k, v in split.items() if v)
        V.info(after, "VmRSS %+d KiB (%d -> %d; anon %+d, file %+d; threads %d -> %d): %s; "
               "Python-side kept %+d B" % (
                   b["VmRSS"] - a["VmRSS"], a["VmRSS"], b["VmRSS"],
                   b["RssAnon"] - a["RssAnon"], b["RssFile"] - a["RssFile"], a["Threads"],
                   b["Threads"], grown or "no mapping grew",
                   python.get("python_bytes", {}).get(after, 0)
                   - python.get("python_bytes", {}).get(before, 0)))
    if names:
        V.info("total", "VmRSS %+d KiB from the monitor's modules to sampling and scrapes "
               "(%d -> %d)" % (steps_seen[names[-1]]["VmRSS"] - steps_seen[names[0]]["VmRSS"],
                               steps_seen[names[0]]["VmRSS"], steps_seen[names[-1]]["VmRSS"]))
    for line in python.get("top", [])[:6]:
        V.info("python-top", line)
    if "with_nvml_kib" in smallest:
        V.info("child", "the smallest process holding NVML: VmRSS %d KiB (python3 alone "
               "%d KiB; NVML's init and one call %+d KiB)" % (
                   smallest["with_nvml_kib"], smallest["python_alone_kib"],
                   smallest["with_nvml_kib"] - smallest["python_alone_kib"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nvml", help="the libnvidia-ml.so.1 (default: as the monitor finds it)")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--pass", dest="which", choices=("rss", "python", "smallest"))
    args = parser.parse_args()
    if args.which == "rss":
        print(json.dumps(measure(args.nvml, args.rounds)))
        return 0
    if args.which == "python":
        print(json.dumps(measure_python(args.nvml, args.rounds)))
        return 0
    rss = child(args, "--pass", "rss")
    if rss.get("not_sampled") or "error" in rss:
        V.skip("all", "no NVML to measure: %s" % (rss.get("not_sampled") or rss.get("error")))
        return gpucheck.SKIP_STATUS
    python = child(args, "--pass", "python")
    smallest = {}
    try:
        done = subprocess.run([sys.executable, "-c", SMALLEST] +
                              ([args.nvml] if args.nvml else []),
                              capture_output=True, text=True, timeout=120)
        smallest = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as err:
        smallest = {"error": str(err)}
    report(rss, python, smallest)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "nvml_memory.jsonl"), "a") as f:
        f.write(json.dumps({"rss": rss, "python": python, "smallest": smallest}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
