#!/usr/bin/env bash
# Kernel names, --summary and --leaks on a real GPU. Run as root from anywhere:
#   OUT=/some/dir scripts/gpu/check_kernels.sh
# Builds kernels_check.cu with nvcc twice (static cudart, the default, and -cudart shared),
# traces each with --summary --leaks --stacks and with --json, checks the JSON with
# check_trace.py, then traces torch_kernels.py (if PyTorch is installed) to $OUT/torch.jsonl
# and reports the fraction of its launches that were named. Exit status: failures count.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-$(mktemp -d /tmp/check_kernels.XXXXXX)}
mkdir -p "$OUT"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
ARCH=${NVCC_ARCH:--arch=native}
failures=0

run() {  # run a command, show it, count its failure
    echo "+ $*" >&2
    "$@" || { echo "FAILED ($?): $*" >&2; failures=$((failures + 1)); }
}

"$NVCC" --version | tail -2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
VECADD="vecAdd(float const*, float const*, float*, int)"
SCALE="void nn::scale<float>(float*, float, int)"
for mode in static shared; do
    exe="$OUT/kernels_check_$mode"
    run "$NVCC" -O2 -g $ARCH -cudart "$mode" -o "$exe" "$HERE/kernels_check.cu" || continue
    echo "=== $mode cudart: --summary --leaks --stacks ==="
    run "$PY" -m ebpf_cuda --summary --leaks --stacks -- "$exe" > "$OUT/summary_$mode.txt" \
        2> "$OUT/summary_$mode.err"
    cat "$OUT/summary_$mode.txt" "$OUT/summary_$mode.err"
    for name in "$VECADD" "$SCALE"; do
        grep -qF "$name" "$OUT/summary_$mode.txt" \
            || { echo "FAIL: $name not in the kernel table ($mode)"; failures=$((failures + 1)); }
    done
    grep -q "1,048,576  cudaMalloc" "$OUT/summary_$mode.txt" \
        || { echo "FAIL: the 1 MiB leak is not reported ($mode)"; failures=$((failures + 1)); }
    echo "=== $mode cudart: --json ==="
    run "$PY" -m ebpf_cuda --json -o "$OUT/kernels_$mode.jsonl" -- "$exe"
    run "$PY" "$HERE/check_trace.py" "$OUT/kernels_$mode.jsonl" --min-resolved 1.0 \
        --expect-kernel "$VECADD" --expect-kernel "$SCALE" --expect-leak 1048576 \
        --expect-copy HostToDevice=8388608 --expect-copy DeviceToHost=4194304 \
        --expect-copy DeviceToDevice=2097152
done

if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "=== PyTorch ==="
    run "$PY" -m ebpf_cuda --json -o "$OUT/torch.jsonl" -- \
        "$PY" "$HERE/torch_kernels.py" --maps-out "$OUT/torch_maps.txt"
    run "$PY" "$HERE/check_trace.py" "$OUT/torch.jsonl" --maps "$OUT/torch_maps.txt"
else
    echo "=== PyTorch with CUDA not available: torch_kernels.py skipped ==="
fi
echo "check_kernels: $failures failure(s); outputs in $OUT"
exit "$failures"
