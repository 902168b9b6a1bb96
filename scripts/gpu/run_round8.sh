#!/bin/sh
# Issue 21, the launch entry without hash-map or helper calls (launch slots, a session
# program per function, a per-CPU draw): the programs' own time per tiny op with
# kernel.bpf_stats_enabled (stats), and the tiny-op loop pinned to one core, untraced, bare
# entry probes, the monitor of this build and of the previous one (old.pyz), alternated
# (tiny); the monitor's counts against CUPTI and PyTorch's allocator, its memory (counts);
# the MLP step (mlp). Run from the repository root, both zipapps carried:
# windows: one child looping under the modes in turn (monitor_h200.py --parts counts+stats)
    OUT=$OUT timeout 200 python3 scripts/gpu/monitor_h200.py --pyz ebpf-cuda.pyz \
        --parts counts > $OUT/monitor_counts.log 2>&1; echo rc=$?
    grep -E '"part": "(counts|monitor)"' $OUT/monitor_counts.log | cut -c1-700
    TINY_CPU=${TINY_CPU:-5} OUT=$OUT timeout 300 python3 scripts/gpu/monitor_h200.py \
        --pyz ebpf-cuda.pyz --old-pyz old.pyz --parts stats --modes \
        bare-entry,bare-multi,monitor,monitor-old --rounds ${ROUNDS:-2} --reps 3 \
        > $OUT/stats.log 2>&1; echo rc=$?
    grep '"part": "stats"' $OUT/stats.log | cut -c1-3000 ;;
windows).
#   sh scripts/gpu/run_round8.sh stats+tiny | counts | mlp | windows | counts+stats
export PYTHONPATH=$PWD/ebpf-cuda.pyz
uname -r; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)|Thread|MHz" | head -5
MODES=untraced,bare-entry,monitor,monitor-old
case "$1" in
stats+tiny)
    TINY_CPU=${TINY_CPU:-5} OUT=$OUT timeout 560 python3 scripts/gpu/monitor_h200.py \
        --pyz ebpf-cuda.pyz --old-pyz old.pyz --parts stats,overhead --workloads time-tiny \
        --modes $MODES --rounds ${ROUNDS:-3} --reps ${REPS:-7} > $OUT/stats_tiny.log 2>&1
    echo rc=$?
    grep -E '"part": "(start|stats|overhead|monitor)"' $OUT/stats_tiny.log | cut -c1-4000 ;;
counts)
    OUT=$OUT timeout 500 python3 scripts/gpu/monitor_h200.py --pyz ebpf-cuda.pyz \
        --parts counts > $OUT/monitor_counts.log 2>&1; echo rc=$?
    cut -c1-1500 $OUT/monitor_counts.log ;;
mlp)
    OUT=$OUT timeout 560 python3 scripts/gpu/monitor_h200.py --pyz ebpf-cuda.pyz \
        --old-pyz old.pyz --parts overhead --workloads time-mlp,time-tiny \
        --modes $MODES --rounds ${ROUNDS:-3} --reps ${REPS:-3} > $OUT/mlp.log 2>&1
    echo rc=$?
    grep '"part": "overhead"' $OUT/mlp.log | cut -c1-3000 ;;
counts+stats)
    OUT=$OUT timeout 200 python3 scripts/gpu/monitor_h200.py --pyz ebpf-cuda.pyz \
        --parts counts > $OUT/monitor_counts.log 2>&1; echo rc=$?
    grep -E '"part": "(counts|monitor)"' $OUT/monitor_counts.log | cut -c1-700
    TINY_CPU=${TINY_CPU:-5} OUT=$OUT timeout 300 python3 scripts/gpu/monitor_h200.py \
        --pyz ebpf-cuda.pyz --old-pyz old.pyz --parts stats --modes \
        bare-entry,bare-multi,monitor,monitor-old --rounds ${ROUNDS:-2} --reps 3 \
        > $OUT/stats.log 2>&1; echo rc=$?
    grep '"part": "stats"' $OUT/stats.log | cut -c1-3000 ;;
windows)
    TINY_CPU=${TINY_CPU:-5} OUT=$OUT timeout 570 python3 scripts/gpu/monitor_h200.py \
        --pyz ebpf-cuda.pyz --old-pyz old.pyz --parts windows --workloads tiny,mlp \
        --modes untraced,bare-entry,bare-multi,monitor,monitor-old --rounds ${ROUNDS:-5} \
        --window ${WINDOW:-5} > $OUT/windows.log 2>&1
    echo rc=$?
    grep -E '"part": "(start|counts+stats)
    OUT=$OUT timeout 200 python3 scripts/gpu/monitor_h200.py --pyz ebpf-cuda.pyz \
        --parts counts > $OUT/monitor_counts.log 2>&1; echo rc=$?
    grep -E '"part": "(counts|monitor)"' $OUT/monitor_counts.log | cut -c1-700
    TINY_CPU=${TINY_CPU:-5} OUT=$OUT timeout 300 python3 scripts/gpu/monitor_h200.py \
        --pyz ebpf-cuda.pyz --old-pyz old.pyz --parts stats --modes \
        bare-entry,bare-multi,monitor,monitor-old --rounds ${ROUNDS:-2} --reps 3 \
        > $OUT/stats.log 2>&1; echo rc=$?
    grep '"part": "stats"' $OUT/stats.log | cut -c1-3000 ;;
windows)"' $OUT/windows.log | cut -c1-3000 ;;
esac
