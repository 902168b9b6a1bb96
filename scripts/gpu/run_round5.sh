#!/bin/sh
# This round's GPU checks (run from the repository root on the H200, the zipapp carried).
export PYTHONPATH=$PWD/ebpf-cuda.pyz
T="python3 ebpf-cuda.pyz"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
echo "== registrations of torch/lib"
timeout 120 python3 scripts/gpu/registrations_check.py > $OUT/registrations.jsonl 2>&1; echo rc=$?
cat $OUT/registrations.jsonl | head -20
echo "== attach eager"
timeout 200 python3 scripts/gpu/attach_check.py "$T" eager $OUT/attach > $OUT/attach_eager.json 2>$OUT/attach_eager.err; echo rc=$?
python3 -c "
import json; r = json.load(open('$OUT/attach_eager.json'))
print({k: r.get(k) for k in ('launches', 'named', 'hinted', 'named_pct', 'cupti_kernels', 'runtime_launches', 'runtime_named', 'runtime_named_pct', 'unnamed_line')})
print('not in cupti:', r.get('runtime_names_not_in_cupti')); print('in cupti:', len(r.get('runtime_names_in_cupti', [])))"
tail -3 $OUT/attach_eager.err
echo "== issue 5 regression (started under the tracer: launches = CUPTI)"
OUT=$OUT/issue5 timeout 240 sh scripts/gpu/run_issue5.sh > $OUT/issue5.log 2>&1; echo rc=$?
grep -E "exit status|ok|FAIL|mismatch|named|launches" $OUT/issue5.log | head -30
