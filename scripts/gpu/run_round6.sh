#!/bin/sh
# This round's GPU checks (run from the repository root on the H200, the zipapp carried):
# issue 18, --py-stacks on a PyTorch training loop (scripts/gpu/py_stacks_check.py).
export PYTHONPATH=$PWD/ebpf-cuda.pyz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import sys, torch; print('torch', torch.__version__, torch.version.cuda, 'python', sys.version.split()[0])"
python3 -m ebpf_cuda --help | grep -q -- --py-stacks || { echo "the zipapp has no --py-stacks: rebuild it (python3 -m ebpf_cuda.bundle -o ebpf-cuda.pyz)"; exit 1; }
echo "== py_stacks_check (attribution of a training loop's calls to its lines; cost per step)"
timeout 480 python3 scripts/gpu/py_stacks_check.py --out $OUT/py_stacks > $OUT/py_stacks_check.log 2>&1; echo rc=$?
grep -E "^(PASS|FAIL|INFO)|^  (run|cost)" $OUT/py_stacks_check.log | cut -c1-600
LIB=$(python3 -c "import torch, glob, os; d=os.path.dirname(torch.__file__); print((glob.glob(d+'/../nvidia/cu*/lib/libcudart.so.1*')+glob.glob(d+'/../nvidia/cuda_runtime/lib/libcudart.so.1*')+glob.glob('/usr/local/cuda/lib64/libcudart.so.1*'))[0])")
echo "== libcudart $LIB"
echo "== py_stacks_target_check (the CI test's target on this host's Python)"
timeout 120 python3 scripts/gpu/py_stacks_target_check.py "$LIB" $OUT/target 2>&1 | tail -5
echo "== bench/py_stacks.py (added ns per call, 10 and 40 frames)"
timeout 200 python3 bench/py_stacks.py --lib "$LIB" --rounds 5 --calls 20000 2>&1 | tail -12
