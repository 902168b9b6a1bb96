#!/bin/sh
# This round's second GPU run (from the repository root on the H200, the zipapp carried):
# issue 18's per-call cost with the final walk, issue 17's `--summary` alone on CUDA graphs,
# issue 21's monitor counts (lost records re-measured).
export PYTHONPATH=$PWD/ebpf-cuda.pyz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
LIB=$(python3 -c "import torch, glob, os; d=os.path.dirname(torch.__file__); print((glob.glob(d+'/../nvidia/cu*/lib/libcudart.so.1*')+glob.glob('/usr/local/cuda/lib64/libcudart.so.1*'))[0])")
echo "== bench/py_stacks.py ($LIB)"
timeout 150 python3 bench/py_stacks.py --lib "$LIB" --rounds 5 --calls 20000 2>&1 | tail -10
echo "== graphs_summary_alone (issue 17)"
timeout 420 python3 scripts/gpu/graphs_summary_alone.py "python3 ebpf-cuda.pyz" $OUT/graphs > $OUT/graphs_summary_alone.log 2>&1; echo rc=$?
cut -c1-1500 $OUT/graphs_summary_alone.log
echo "== monitor counts (issue 21)"
OUT=$OUT timeout 300 python3 scripts/gpu/monitor_h200.py --pyz ebpf-cuda.pyz --parts counts > $OUT/monitor_counts.log 2>&1; echo rc=$?
cut -c1-900 $OUT/monitor_counts.log | tail -12
