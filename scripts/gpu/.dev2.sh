export PYTHONPATH=$PWD/ebpf-cuda.pyz
T=$(python3 -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'lib', 'libtorch_cuda.so'))")
( ls -la $T; readelf -S -W $T | grep -E "symtab|dynsym|debug"; nm $T 2>&1 | grep -c device_stub; nm -D $T | wc -l ) > $OUT/symtab.log 2>&1
for m in eager compile; do timeout 240 python3 scripts/gpu/attach_check.py "python3 $PWD/ebpf-cuda.pyz" $m /tmp/attach >> $OUT/attach.log 2>&1; done
cp /tmp/attach/attach-*.err $OUT/ 2>/dev/null
