#!/bin/sh
# Issue 21, the launch entry without hash-map or helper calls (launch slots, a session
# program per function, a per-CPU draw), on the H200. Run from the repository root, this
# build's zipapp and the previous build's (old.pyz, mode monitor-old) carried:
#   sh scripts/gpu/run_round8.sh stats+tiny | counts | counts+stats | windows | mlp
# stats+tiny: the programs' own time per tiny op (kernel.bpf_stats_enabled: stats), then
#   the tiny-op loop pinned to one core under each mode in turn, fastest reps (tiny);
# counts: the monitor's launches against CUPTI and PyTorch's allocator, its memory;
# counts+stats: both, the stats also with the bare probes through uprobe_multi;
# windows: one child looping while the modes take turns under it (--parts windows);
# mlp: the MLP step and the tiny loop, modes alternated.
export PYTHONPATH=$PWD/ebpf-cuda.pyz
uname -r; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)|Thread|MHz" | head -5
MODES=untraced,bare-entry,monitor,monitor-old
H200="python3 scripts/gpu/monitor_h200.py --pyz ebpf-cuda.pyz --old-pyz old.pyz"
export TINY_CPU=${TINY_CPU:-5}
case "$1" in
stats+tiny)
    OUT=$OUT timeout 560 $H200 --parts stats,overhead --workloads time-tiny --modes $MODES \
        --rounds ${ROUNDS:-3} --reps ${REPS:-7} > $OUT/stats_tiny.log 2>&1
    echo rc=$?
    grep -E '"part": "(start|stats|overhead|monitor)"' $OUT/stats_tiny.log | cut -c1-4000 ;;
counts)
    OUT=$OUT timeout 500 $H200 --parts counts > $OUT/monitor_counts.log 2>&1; echo rc=$?
    cut -c1-1500 $OUT/monitor_counts.log ;;
counts+stats)
    OUT=$OUT timeout 200 $H200 --parts counts > $OUT/monitor_counts.log 2>&1; echo rc=$?
    grep -E '"part": "(counts|monitor)"' $OUT/monitor_counts.log | cut -c1-700
    OUT=$OUT timeout 300 $H200 --parts stats --modes bare-entry,bare-multi,monitor,monitor-old \
        --rounds ${ROUNDS:-2} --reps 3 > $OUT/stats.log 2>&1; echo rc=$?
    grep '"part": "stats"' $OUT/stats.log | cut -c1-3000 ;;
windows)
    OUT=$OUT timeout 570 $H200 --parts windows --workloads tiny,mlp \
        --modes untraced,bare-entry,bare-multi,monitor,monitor-old --rounds ${ROUNDS:-5} \
        --window ${WINDOW:-5} > $OUT/windows.log 2>&1; echo rc=$?
    grep -E '"part": "(start|windows)"' $OUT/windows.log | cut -c1-3000 ;;
mlp)
    OUT=$OUT timeout 560 $H200 --parts overhead --workloads time-mlp,time-tiny --modes $MODES \
        --rounds ${ROUNDS:-3} --reps ${REPS:-3} > $OUT/mlp.log 2>&1; echo rc=$?
    grep '"part": "overhead"' $OUT/mlp.log | cut -c1-3000 ;;
*)
    echo "usage: sh scripts/gpu/run_round8.sh stats+tiny|counts|counts+stats|windows|mlp" >&2
    exit 2 ;;
esac
