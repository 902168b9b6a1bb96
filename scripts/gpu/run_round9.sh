#!/bin/sh
# Issue 21 round 9, on the H200: the kernel names kept compressed (name_store.py). Run from
# the repository root with this build's zipapp carried:
#   sh scripts/gpu/run_round9.sh counts | windows
# counts: the monitor beside the PyTorch, torch.compile and CuPy loops (against CUPTI and
#   PyTorch's allocator), then PARALLEL (default 4) MLP children started at once (each
#   registering PyTorch's kernels in the same second: names and losses), then its memory;
# windows: one child looping while the modes take turns under it (--parts windows).
export PYTHONPATH=$PWD/ebpf-cuda.pyz
uname -r; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)" | head -2
H200="python3 scripts/gpu/monitor_h200.py --pyz ebpf-cuda.pyz"
case "$1" in
counts)
    OUT=$OUT timeout 420 $H200 --parts counts,parallel --parallel ${PARALLEL:-4} \
        > $OUT/monitor_counts.log 2>&1; echo rc=$?
    grep -E '"part": "(counts|parallel|monitor)"' $OUT/monitor_counts.log | cut -c1-1800 ;;
windows)
    OUT=$OUT timeout 570 $H200 --parts windows --workloads tiny,mlp \
        --modes untraced,bare-entry,bare-multi,monitor --rounds ${ROUNDS:-5} \
        --window ${WINDOW:-5} > $OUT/windows.log 2>&1; echo rc=$?
    grep -E '"part": "(start|windows)"' $OUT/windows.log | cut -c1-3000 ;;
esac
