"""Issue 17 on one GPU: `--summary` alone (in-kernel aggregates, the capture state kept in
the kernel) counts the kernels of CUDA graphs as the decoded summary does.

    python3 scripts/gpu/graphs_summary_alone.py "python3 ebpf-cuda.pyz" "$OUT"   (as root)

The targets of scripts/gpu/graphs_check.py (torch.cuda.CUDAGraph, 50 replays;
torch.compile(mode="reduce-overhead"), 100 calls) run twice each: under
`--json -o /dev/null --summary` (every call a record, the summary from decoded events) and
under `--summary` alone. Their kernel tables must have the same rows: Launches (kernels run,
eager or by graph launches), In graphs, Captured, grid, block, kernel name. Both runs are of
the same deterministic program, so equal counts are known by construction — once the
compilers' caches are off: with them, the second torch.compile run reuses the first one's
autotuning and launches ~600 fewer kernels (D23's first comparison). Each run gets empty
Inductor and Triton cache directories and TORCHINDUCTOR_FORCE_DISABLE_CACHES=1, and `--summary`
alone runs first.
"""
import json
import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def kernel_rows(stdout: str):
    """{row text after the counts: (launches, in graphs, captured)} of the kernel table."""
    part = stdout.split(" ** Kernel Launches", 1)[1].split("\n\n")[1]
    lines = part.splitlines()
    rows = {}
    for line in lines[2:]:
        cells = line.split()
        if len(cells) < 4 or not cells[0].replace(",", "").isdigit():
            break
        counts = tuple(int(c.replace(",", "")) for c in cells[:3])
        key = " ".join(cells[3:])
        have = rows.get(key, (0, 0, 0))
        rows[key] = tuple(a + b for a, b in zip(have, counts))
    return rows


def main() -> int:
    tracer, outdir = shlex.split(sys.argv[1]), sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    ok = True
    for case in ("cudagraph", "compile"):
        target = [sys.executable, os.path.join(HERE, "graphs_check.py"), "--target", case,
                  outdir]
        runs = {}
        for name, options in (("alone", ["--summary"]),
                              ("decoded", ["--json", "-o", "/dev/null", "--summary"])):
            env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1",
                       TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="inductor-"),
                       TRITON_CACHE_DIR=tempfile.mkdtemp(prefix="triton-"))
            done = subprocess.run(tracer + options + ["--"] + target, capture_output=True,
                                  text=True, timeout=900, env=env)
            runs[name] = (done.returncode, kernel_rows(done.stdout) if " ** Kernel Launches"
                          in done.stdout else {}, done.stderr[-800:])
        decoded, alone = runs["decoded"][1], runs["alone"][1]
        totals = {name: [sum(r[i] for r in rows.values()) for i in range(3)]
                  for name, rows in (("decoded", decoded), ("alone", alone))}
        same = decoded == alone and bool(decoded)
        ok &= same
        print(json.dumps({"case": case, "same_kernel_table": same, "totals (launches, in "
                          "graphs, captured)": totals, "rows": len(decoded),
                          "only_decoded": {k: v for k, v in decoded.items() if alone.get(k) != v},
                          "only_alone": {k: v for k, v in alone.items() if decoded.get(k) != v},
                          "exits": [runs["decoded"][0], runs["alone"][0]],
                          "stderr_alone": runs["alone"][2]}), flush=True)
    print("%s graphs_summary_alone" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
