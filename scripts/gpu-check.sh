#!/usr/bin/env bash
# gpu-check.sh: on a GPU host (root, nvcc, pyelftools and click importable), build
# examples/basic02.cu both ways nvcc links the CUDA runtime and trace it every way the
# tracer can: -- COMMAND, -p PATH (system-wide, then run), -d PID (attach to a running one).
# Each JSON trace is checked by scripts/check_basic02.py.
#
#   scripts/gpu-check.sh [OUTDIR]        (default OUTDIR: build/gpu-check)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/gpu-check}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
TRACE="python3 -m ebpf_cuda"
mkdir -p "$OUT"
status=0
check() { python3 scripts/check_basic02.py "$1" || status=1; }

"$NVCC" --version | tail -n 1
"$NVCC" -O2 -o "$OUT/basic02-static" examples/basic02.cu || exit 2
"$NVCC" -O2 -cudart shared -o "$OUT/basic02-shared" examples/basic02.cu || exit 2

for kind in static shared; do
    bin="$OUT/basic02-$kind"
    echo "== $kind: text output, -- COMMAND"
    $TRACE -v -- "$bin"
    echo "== $kind: -- COMMAND, JSON"
    $TRACE --json -o "$OUT/$kind-command.jsonl" -- "$bin" && check "$OUT/$kind-command.jsonl"

    echo "== $kind: -p PATH (system-wide), then run"
    path="$bin"
    [ "$kind" = shared ] && path=$(ldd "$bin" | awk '/libcudart/ {print $3}')
    $TRACE --json -o "$OUT/$kind-path.jsonl" -p "$path" &
    tracer=$!
    sleep 3
    "$bin"
    sleep 1
    kill -INT $tracer; wait $tracer
    check "$OUT/$kind-path.jsonl"

    echo "== $kind: -d PID"
    "$bin" 3000 > "$OUT/$kind-pid.out" &
    target=$!
    sleep 0.5
    $TRACE --json -o "$OUT/$kind-pid.jsonl" -d $target
    wait $target
    check "$OUT/$kind-pid.jsonl"
done
exit $status
