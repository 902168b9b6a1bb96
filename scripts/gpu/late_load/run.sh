#!/bin/sh
# Runtimes loaded later, on the GPU: CuPy's own runtime calls (known counts) and a PyTorch
# warm-up's cudaMalloc against CUPTI, traced by this tree's tracer (a fresh zipapp).
cd "$(dirname "$0")" || exit 1  # (ebpf-cuda.pyz copied here first: python3 -m ebpf_cuda.bundle -o scripts/gpu/late_load/ebpf-cuda.pyz)
T="python3 ebpf-cuda.pyz"
echo "== versions"; python3 -c "import torch, cupy; print(torch.__version__, cupy.__version__)"
echo "== kernel: $(uname -r)"
echo "== cupy"
$T -v --json -o $OUT/cupy.jsonl --api runtime --functions cudaMalloc,cudaFree,cudaDeviceSynchronize,cudaGetDeviceCount -- python3 cupy_prog.py 50 > $OUT/cupy.out 2> $OUT/cupy.err
echo "rc=$?"; tail -n 2 $OUT/cupy.out; grep -E "^probing|probed|watching|warning|error|lost|not probed" $OUT/cupy.err | head -20
python3 -c "
import json,collections
c=collections.Counter(e['api'] for e in map(json.loads, open('$OUT/cupy.jsonl')) if e['phase']=='exit')
print('tracer exits:', dict(c))"
echo "== torch warm-up"
$T -v --all --json -o $OUT/torch.jsonl --api runtime -- python3 torch_warm.py > $OUT/torch.out 2> $OUT/torch.err
echo "rc=$?"; cat $OUT/torch.out | cut -c1-600; grep -E "^probing|probed|watching|warning|error|lost|not probed" $OUT/torch.err | head -20
python3 -c "
import json,collections
c=collections.Counter(e['api'] for e in map(json.loads, open('$OUT/torch.jsonl')) if e['phase']=='exit')
print('tracer exits:', dict(c))"
