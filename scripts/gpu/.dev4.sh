export PYTHONPATH=$PWD/ebpf-cuda.pyz NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/g; timeout 200 python3 scripts/gpu/graphs_check.py "python3 $PWD/ebpf-cuda.pyz" /tmp/g > $OUT/graphs.log 2>&1; cp /tmp/g/*.jsonl $OUT/ 2>/dev/null; ls /tmp/g >> $OUT/graphs.log
timeout 150 python3 scripts/gpu/attach_check.py "python3 $PWD/ebpf-cuda.pyz" eager /tmp/attach > $OUT/attach.log 2>&1
( OUT=/tmp/issue5 timeout 200 sh scripts/gpu/run_issue5.sh ) > $OUT/issue5.log 2>&1
OUT=/tmp/mon timeout 200 python3 scripts/gpu/monitor_h200.py --pyz ebpf-cuda.pyz --parts counts > $OUT/monitor.log 2>&1; cp /tmp/mon/monitor_h200.jsonl $OUT/ 2>/dev/null
