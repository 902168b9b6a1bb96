#!/bin/sh
# Issue 5 on a GPU: trace driver_check (runtime + driver API, graphs, a PTX module), a Triton
# kernel and a small PyTorch training run, then count and name the launches each trace shows
# (compare_issue5.py; the PyTorch one against torch.profiler's CUPTI count of the same steps).
#   OUT=/some/dir sh scripts/gpu/run_issue5.sh     (run from anywhere, as root)
# Files in $OUT: <name>.jsonl (trace), <name>.out (program stdout), <name>.err (tracer -v and
# program stderr), <name>.compare (the checker's report, also printed).
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/issue5}
mkdir -p "$OUT"
HERE=scripts/gpu
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
status=0

trace() {  # trace NAME COMMAND...
    name=$1; shift
    echo "== tracing $name: $*"
    python3 -m ebpf_cuda -v --json -o "$OUT/$name.jsonl" -- "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
    rc=$?
    echo "exit status $rc; $(wc -l <"$OUT/$name.jsonl") events; program said: $(tail -n 1 "$OUT/$name.out")"
    [ $rc -eq 0 ] || { status=1; tail -n 20 "$OUT/$name.err"; }
    python3 $HERE/compare_issue5.py --name "$name" --program-output "$OUT/$name.out" \
        "$OUT/$name.jsonl" | tee "$OUT/$name.compare" || status=1
}

if "$NVCC" -O2 -o "$OUT/driver_check" $HERE/driver_check.cu -lcuda; then
    "$OUT/driver_check" >"$OUT/driver_check.untraced.out" 2>&1 || status=1
    echo "untraced driver_check: $(tail -n 1 "$OUT/driver_check.untraced.out")"
    trace driver_check "$OUT/driver_check"
else
    echo "nvcc failed"; status=1
fi
trace triton_check python3 $HERE/triton_check.py
trace torch_profile python3 $HERE/torch_profile_compare.py
echo "== done (status $status); files in $OUT"
exit $status
