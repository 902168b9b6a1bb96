export PYTHONPATH=$PWD/ebpf-cuda.pyz NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for m in eager compile; do timeout 240 python3 scripts/gpu/attach_check.py "python3 $PWD/ebpf-cuda.pyz" $m /tmp/attach >> $OUT/attach.log 2>&1; done
cp /tmp/attach/attach-*.err $OUT/ 2>/dev/null
mkdir -p /tmp/nccl; timeout 240 python3 scripts/gpu/nccl_check.py "python3 $PWD/ebpf-cuda.pyz" /tmp/nccl > $OUT/nccl.log 2>&1; cp /tmp/nccl/nccl_check.jsonl $OUT/ 2>/dev/null
