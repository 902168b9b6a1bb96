#!/bin/sh
# Issue 21: the monitor's cost with launch returns sampled (uprobe sessions, the default)
# and with every return taken, beside untraced and the bare floor, alternated in one run
# (monitor_h200.py --parts overhead); the tiny-op loop alone, pinned to one core, with more
# rounds (tiny); the monitor's counts against CUPTI and PyTorch's allocator (counts). Run
# from the repository root, the zipapp carried:
#   sh scripts/gpu/run_round7.sh overhead | tiny | counts
export PYTHONPATH=$PWD/ebpf-cuda.pyz
uname -r; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "$1" in
overhead)
    OUT=$OUT timeout 560 python3 scripts/gpu/monitor_h200.py --pyz ebpf-cuda.pyz \
        --parts overhead --rounds ${ROUNDS:-2} --reps ${REPS:-3} > $OUT/overhead.log 2>&1
    echo rc=$?
    grep '"part": "overhead"' $OUT/overhead.log | cut -c1-3000 ;;
tiny)
    TINY_CPU=${TINY_CPU:-5} OUT=$OUT timeout 480 python3 scripts/gpu/monitor_h200.py \
        --pyz ebpf-cuda.pyz --parts overhead --workloads time-tiny --rounds ${ROUNDS:-4} \
        --reps ${REPS:-7} > $OUT/tiny.log 2>&1; echo rc=$?
    grep '"part": "overhead"' $OUT/tiny.log | cut -c1-3000 ;;
counts)
    OUT=$OUT timeout 400 python3 scripts/gpu/monitor_h200.py --pyz ebpf-cuda.pyz \
        --parts counts > $OUT/monitor_counts.log 2>&1; echo rc=$?
    cut -c1-1500 $OUT/monitor_counts.log ;;
esac
