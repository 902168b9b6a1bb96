"""NCCL calls of torch.distributed traced and checked against what the script issued
(issue 20; run.sh's `nccl`), on one GPU (NCCL backend, world_size=1).

    python3 scripts/gpu/nccl_check.py [--out DIR]        (as root)

The tracer is $TRACER (run.sh: `python3 ebpf-cuda.pyz`), else `python3 -m ebpf_cuda`.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1 are set for the target unless given).

The target (this file with --target) makes the process group (eager init on cuda:0), then
issues all_reduce, broadcast, all_gather_into_tensor and reduce_scatter_tensor with known
sizes and dtypes, then one DDP training step, each phase between two marker all_reduces of
MARK int32 elements, and writes what it issued (issued.json). It is traced twice:
1. `--api nccl --json`: every NCCL call. Checks: the issued collectives are there, in
   order, with their count, datatype and bytes (torch makes no ncclReduceScatter for a
   one-rank reduce_scatter_tensor: it copies, as CUPTI showed in D21; so that one may be
   absent, and if present must match); the DDP step's all_reduce bytes add up to its
   gradients' bytes (DDP buckets them); every collective has the communicator's id, rank 0
   of 1, and sequence numbers 1, 2, 3... without a gap;
2. `--save` with the default API set, then `report --summary` (it has an NCCL table) and
   `report --collectives` (the merge, one rank): both exit 0.
Also (INFO): which of the table's NCCL functions the host's libnccl exports. Results: one
JSON object per line in DIR/nccl_check.jsonl. Exit status 1 on any FAIL, 77 when torch has
no NCCL here.
"""
import argparse
import json
import os
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucheck  # noqa: E402

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
MARK = 7777  # marker all_reduces: MARK int32 elements (no issued collective has that count)
TORCH_DTYPES = {"float32": ("ncclFloat32", 4), "bfloat16": ("ncclBfloat16", 2),
                "float16": ("ncclFloat16", 2), "int32": ("ncclInt32", 4),
                "int64": ("ncclInt64", 8), "float64": ("ncclFloat64", 8)}


# ---- the target: torch.distributed on one GPU --------------------------------------------

def target(outdir: str) -> None:
    import torch
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                      WORLD_SIZE="1")
    torch.cuda.set_device(0)
    device = torch.device("cuda:0")
    try:
        dist.init_process_group("nccl", device_id=device)  # eager: the communicator now
    except TypeError:  # older torch: no device_id
        dist.init_process_group("nccl")
    issued = []

    def note(op, tensor_count, dtype, phase):
        issued.append({"op": op, "count": tensor_count, "dtype": str(dtype).split(".")[-1],
                       "phase": phase})

    def marker(phase):
        dist.all_reduce(torch.zeros(MARK, dtype=torch.int32, device=device))
        note("all_reduce", MARK, torch.int32, phase)

    marker("explicit")
    a = torch.ones(1 << 20, dtype=torch.float32, device=device)
    dist.all_reduce(a)
    note("all_reduce", a.numel(), a.dtype, "explicit")
    b = torch.ones(3000, dtype=torch.bfloat16, device=device)
    dist.broadcast(b, src=0)
    note("broadcast", b.numel(), b.dtype, "explicit")
    c = torch.ones(4096, dtype=torch.float16, device=device)
    gathered = torch.empty(4096 * dist.get_world_size(), dtype=c.dtype, device=device)
    dist.all_gather_into_tensor(gathered, c)
    note("all_gather", c.numel(), c.dtype, "explicit")  # per-rank (send) count
    d = torch.ones(2048 * dist.get_world_size(), dtype=torch.float32, device=device)
    out = torch.empty(2048, dtype=d.dtype, device=device)
    dist.reduce_scatter_tensor(out, d)
    note("reduce_scatter", out.numel(), d.dtype, "explicit")  # per-rank (receive) count
    issued[-1]["optional"] = dist.get_world_size() == 1  # (torch copies for one rank: D21)
    torch.cuda.synchronize()
    marker("explicit")

    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    torch.cuda.synchronize()
    marker("ddp")
    loss = ddp(torch.randn(64, 512, device=device)).sum()
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    marker("ddp")
    dist.destroy_process_group()
    maps = [line.split()[-1] for line in open("/proc/self/maps") if "libnccl" in line]
    with open(os.path.join(outdir, "issued.json"), "w") as f:
        json.dump({"issued": issued, "ddp_grad_bytes": grad_bytes,
                   "nccl_version": ".".join(map(str, torch.cuda.nccl.version()))
                   if hasattr(torch.cuda, "nccl") else None,
                   "libnccl": sorted(set(maps)), "torch": torch.__version__}, f)


# ---- the checks ----------------------------------------------------------------------------

API = {"all_reduce": "ncclAllReduce", "broadcast": "ncclBroadcast",
       "all_gather": "ncclAllGather", "reduce_scatter": "ncclReduceScatter"}
COUNT = {"ncclAllGather": "sendcount", "ncclReduceScatter": "recvcount"}


def _count(event):
    return event["args"].get(COUNT.get(event["api"], "count"))


def check_trace(trace_path: str, issued: dict) -> dict:
    events = [e for e in (json.loads(line) for line in open(trace_path)
                          if line.startswith("{")) if "type" not in e]  # (calls only)
    exits = [e for e in events if e["phase"] == "exit"]
    result = {"events": len(events), "apis": {}}
    for e in exits:
        result["apis"][e["api"]] = result["apis"].get(e["api"], 0) + 1
    inits = [e for e in exits if e["api"].startswith("ncclCommInit")]
    result["inits"] = [{"api": e["api"], "ret_name": e["ret_name"],
                        "args": e["args"], "comm": e.get("comm")} for e in inits]
    collectives = [e for e in exits if e["api"] in API.values()
                   or e["api"] in ("ncclReduce", "ncclAlltoAll", "ncclGather", "ncclScatter")]
    comm_ids = sorted({str(e["args"].get("comm_id")) for e in collectives})
    result["comm_ids"] = comm_ids
    by_comm = {}
    for e in collectives:
        by_comm.setdefault(e["args"].get("comm_id"), []).append(e["args"].get("seq"))
    result["seq_contiguous"] = {str(k): v == list(range(1, len(v) + 1))
                                for k, v in by_comm.items()}
    result["rank_nranks"] = sorted({"%s/%s" % (e["args"].get("rank"), e["args"].get("nranks"))
                                    for e in collectives})
    result["failed_collectives"] = [e for e in collectives if e["ret"] != 0][:5]
    # the issued explicit collectives, in order, between the first two markers
    marks = [i for i, e in enumerate(collectives)
             if e["api"] == "ncclAllReduce" and _count(e) == MARK]
    result["markers_seen"] = len(marks)
    checks = []
    if len(marks) >= 4:
        window = collectives[marks[0] + 1:marks[1]]
        wanted = [i for i in issued["issued"] if i["phase"] == "explicit" and i["count"] != MARK]
        seen = [[e["api"], _count(e), e["args"].get("datatype"), e["args"].get("bytes")]
                for e in window]

        def call(i):
            return [API[i["op"]], i["count"], TORCH_DTYPES[i["dtype"]][0],
                    i["count"] * TORCH_DTYPES[i["dtype"]][1]]
        expect = [call(i) for i in wanted]
        required = [call(i) for i in wanted if not i.get("optional")]
        checks.append({"check": "explicit collectives, in order, exact",
                       "ok": seen in (expect, required), "seen": seen, "expected": expect,
                       "optional": [call(i) for i in wanted if i.get("optional")]})
        ddp = collectives[marks[2] + 1:marks[3]]
        reduce_bytes = sum(e["args"].get("bytes") or 0 for e in ddp
                           if e["api"] == "ncclAllReduce")
        checks.append({"check": "DDP step: all_reduce bytes == gradient bytes",
                       "ok": reduce_bytes == issued["ddp_grad_bytes"],
                       "all_reduce_bytes": reduce_bytes, "grad_bytes": issued["ddp_grad_bytes"],
                       "calls": [(e["api"], _count(e), e["args"].get("datatype"),
                                  e["args"].get("seq")) for e in ddp]})
    checks.append({"check": "one communicator id, rank 0 of 1, sequence without gaps",
                   "ok": len(comm_ids) == 1 and comm_ids != ["None"]
                   and result["rank_nranks"] == ["0/1"]
                   and all(result["seq_contiguous"].values())})
    result["checks"] = checks
    return result


def exports(pyz: str, libs) -> dict:
    """Which NCCL rows of the table each libnccl exports (the tracer's own ELF reader)."""
    code = ("import sys, json; sys.path.insert(0, %r)\n"
            "from ebpf_cuda.spec import apis\nfrom ebpf_cuda.targets.elf import open_elf\n"
            "rows = [s for a in apis.TABLE if a.library == 'nccl' for s in a.symbols]\n"
            "out = {}\n"
            "for lib in %r:\n"
            "    have = open_elf(lib).has_any(rows)\n"
            "    out[lib] = {'missing': [s for s in rows if s not in have], 'present': len(have)}\n"
            "print(json.dumps(out))" % (pyz, list(libs)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-2000:]}


def _run(command, timeout: float, env=None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=env)
    except subprocess.TimeoutExpired as late:
        return subprocess.CompletedProcess(command, 124, str(late.stdout or ""),
                                           str(late.stderr or "") + "\n(timed out)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/ebpf-cuda-nccl"))
    parser.add_argument("--timeout", type=float, default=300, help="s, per run")
    parser.add_argument("--target", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.target:
        target(args.target)
        return 0
    tracer, outdir = gpucheck.tracer_command(), args.out
    os.makedirs(outdir, exist_ok=True)
    v = gpucheck.Verdicts("nccl")
    probe = subprocess.run([sys.executable, "-c", "import torch.distributed as d; "
                            "raise SystemExit(0 if d.is_nccl_available() else 3)"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        v.skip("all", "torch.distributed with NCCL not available here (%s)"
               % gpucheck.tail(probe.stderr, 1))
        return v.status()
    env = dict(NO_MULTICAST, **os.environ)
    results = []

    def emit(obj):
        results.append(obj)
        with open(os.path.join(outdir, "nccl_check.jsonl"), "a") as f:
            f.write(json.dumps(obj) + "\n")

    target_cmd = [sys.executable, os.path.abspath(__file__), "--target", outdir]
    trace = os.path.join(outdir, "nccl_trace.jsonl")
    issued_path = os.path.join(outdir, "issued.json")
    if os.path.exists(issued_path):
        os.unlink(issued_path)
    done = _run(tracer + ["--api", "nccl", "--json", "-o", trace, "--"] + target_cmd,
                args.timeout, env)
    emit({"run": "api nccl --json", "exit": done.returncode, "stderr": done.stderr[-3000:]})
    if done.returncode != 0 or not os.path.exists(issued_path) or not os.path.exists(trace):
        v.add("traced run", False, "exited %d (%s)" % (done.returncode,
                                                       gpucheck.tail(done.stderr)))
        return v.status()
    with open(issued_path) as f:
        issued = json.load(f)
    emit({"target": {k: v_ for k, v_ in issued.items() if k != "issued"},
          "issued": len(issued["issued"])})
    v.info("target", "torch %s, NCCL %s (%s)" % (issued["torch"], issued["nccl_version"],
                                                 ", ".join(issued["libnccl"])))
    found = check_trace(trace, issued)
    emit(found)
    lost = gpucheck.lost_in(done.stderr)
    v.add("markers", found["markers_seen"] >= 4 and not lost,
          "%d of the 4 marker all_reduces seen; %d events lost; NCCL calls %s"
          % (found["markers_seen"], lost, found["apis"]))
    for item in found["checks"]:
        detail = {k: item[k] for k in item if k not in ("check", "ok", "calls")}
        v.add(item["check"], item["ok"], json.dumps(detail))
    pyz = next((p for p in tracer if p.endswith(".pyz")), None)
    if pyz is not None:
        rows = exports(os.path.abspath(pyz), issued["libnccl"])
        emit({"exports": rows})
        v.info("exports", json.dumps(rows)[:600])
    saved = os.path.join(outdir, "nccl_run.ebpfcuda")
    done = _run(tracer + ["--save", saved, "--"] + target_cmd, args.timeout, env)
    emit({"run": "--save (default API set)", "exit": done.returncode,
          "stderr": done.stderr[-2000:]})
    reports = {}
    for extra in (["--summary"], ["--collectives"]):
        report = _run(tracer + ["report"] + extra + [saved], args.timeout)
        text = report.stdout
        if extra == ["--summary"]:
            text = text[text.find(" ** NCCL Summary"):] if "NCCL Summary" in text else text[-3000:]
        reports[extra[0]] = (report.returncode, "NCCL Summary" in report.stdout)
        emit({"report": extra[0], "exit": report.returncode, "stdout": text[-6000:],
              "stderr": report.stderr[-2000:]})
    v.add("saved trace and its reports", done.returncode == 0
          and reports["--summary"] == (0, True) and reports["--collectives"][0] == 0,
          "--save exited %d; report --summary exited %d, %s NCCL table; report --collectives "
          "exited %d" % (done.returncode, reports["--summary"][0],
                         "with its" if reports["--summary"][1] else "WITHOUT an",
                         reports["--collectives"][0]))
    if os.path.exists(saved):
        os.unlink(saved)  # (large; the reports above say what it held)
    os.unlink(trace)
    return v.status()


if __name__ == "__main__":
    raise SystemExit(main())
