#!/bin/bash
# Issue 7's figures on a GPU machine (the lead runs this on the H200): writes everything to $OUT.
#
#   OUT=/some/dir bash bench/gpu/run_all.sh [SECTION...]
#
# Sections (default: all, in this order; each stays well under 10 minutes):
#   env       nvidia-smi, driver, Python, torch, the libraries found
#   overhead  bench/overhead.py on NVIDIA's libcudart (callloop: cudaGetDevice; launch of a
#             host function, which the runtime rejects: the error path's probe cost)
#   cudaloop  bench/gpu/cuda_loop.cu (needs nvcc): cudaGetDevice and empty-kernel launches, ns
#             per call, untraced / default / -r / --all / --summary / --save
#   torch     bench/gpu/torch_bench.py (needs torch): MLP training step and tiny-op loop
#   startup   bench/startup.py     memory   bench/memory.py     loss   bench/loss.py
# Every section's output goes to $OUT/<section>.txt (and to stdout).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ebpf-cuda-gpu-bench}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
# option sets of the cudaloop and torch sections (labels of bench/gpu/traced.py --sets)
SETS=${SETS:-untraced,default,-r,--all,--summary,--save}
SECTIONS=${*:-env overhead cudaloop torch startup memory loss}
BUILD=${EBPF_CUDA_BENCH_BUILD:-/tmp/ebpf-cuda-bench}
export EBPF_CUDA_BENCH_BUILD=$BUILD
mkdir -p "$BUILD"

CUDART=$($PY bench/gpu/find_libs.py | grep libcudart | head -1)
LIBS=$($PY bench/gpu/find_libs.py)

section() {  # section NAME COMMAND...: run, tee to $OUT/NAME.txt, note the time taken
    local name=$1; shift
    echo "=== $name: $*" | tee -a "$OUT/$name.txt"
    local t0=$(date +%s)
    "$@" 2>&1 | tee -a "$OUT/$name.txt"
    echo "=== $name took $(( $(date +%s) - t0 )) s" | tee -a "$OUT/$name.txt"
}

p_args() { for lib in $1; do printf -- '--lib %s ' "$lib"; done; }

for s in $SECTIONS; do
  case $s in
    env)
      section env bash -c "date -u; uname -a; nproc; nvidia-smi || true; $PY --version;
        $PY -c 'import torch; print(\"torch\", torch.__version__, torch.version.cuda)' || true;
        which nvcc && nvcc --version || true; echo libraries: $LIBS" ;;
    overhead)
      if [ -z "$CUDART" ]; then echo "no libcudart found" | tee "$OUT/overhead.txt"; continue; fi
      section overhead $PY bench/overhead.py --lib "$CUDART" --op getdevice --rounds 3
      section overhead $PY bench/overhead.py --lib "$CUDART" --op launch --rounds 3 \
        --no-components ;;
    cudaloop)
      if ! command -v nvcc >/dev/null; then echo "no nvcc: skipped" | tee "$OUT/cudaloop.txt"; continue; fi
      nvcc -O2 -cudart shared -o "$BUILD/cuda_loop" bench/gpu/cuda_loop.cu || continue
      LOOP_LIBS=$(ldd "$BUILD/cuda_loop" | awk '/libcudart/ {print $3}')
      LOOP_LIBS="$LOOP_LIBS $(echo "$LIBS" | grep 'libcuda\.so' | head -1)"
      section cudaloop $PY bench/gpu/traced.py $(p_args "$LOOP_LIBS") --rounds ${ROUNDS:-3} --sets "$SETS" -- \
        "$BUILD/cuda_loop" 100000 5 ;;
    torch)
      if ! $PY -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
        echo "no torch with CUDA: skipped" | tee "$OUT/torch.txt"; continue; fi
      TORCH_LIBS=$($PY bench/gpu/find_libs.py torch)
      section torch $PY bench/gpu/traced.py $(p_args "$TORCH_LIBS") --rounds ${ROUNDS:-3} \
        --sets "$SETS" -- $PY bench/gpu/torch_bench.py mlp --steps 100 --reps 5
      section torch $PY bench/gpu/traced.py $(p_args "$TORCH_LIBS") --rounds ${ROUNDS:-3} \
        --sets "$SETS" -- $PY bench/gpu/torch_bench.py tiny --ops 20000 --reps 5 ;;
    startup) section startup $PY bench/startup.py --runs 7 ;;
    memory) section memory $PY bench/memory.py --seconds 10 ;;
    loss) section loss $PY bench/loss.py --seconds 10 --rate-seconds 5 ;;
    *) echo "unknown section $s" ;;
  esac
done
echo "results in $OUT"
