#!/bin/bash
# Does it matter where the tracer runs relative to the traced thread? On a VM whose vCPUs are
# hyperthreads, a busy tracer on the traced thread's sibling slows it down. Runs the tiny-op
# PyTorch loop pinned to one CPU, untraced and traced (--save, and the default text output to
# /dev/null) with the tracer pinned to that CPU's sibling thread, to another core, or unpinned.
#
#   bash bench/gpu/placement.sh      (root, on the GPU host; prints `label result...` lines)
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
P=""; for lib in $($PY bench/gpu/find_libs.py torch); do P="$P -p $lib"; done
W=${WORKLOAD_CPU:-2}
SIB=$(tr ',' '\n' < /sys/devices/system/cpu/cpu$W/topology/thread_siblings_list | grep -vx "$W" | head -1)
OTHER=${OTHER_CPU:-$(( $(nproc) - 1 ))}
echo "workload cpu $W, its sibling ${SIB:-none}, another core $OTHER"
lscpu -e=CPU,CORE,SOCKET,NODE 2>/dev/null | head -20
TINY="$PY bench/gpu/torch_bench.py tiny --ops 20000 --reps 5"
run() {  # run LABEL COMMAND...
    local label=$1; shift
    echo "$label $("$@" 2>/tmp/placement.err | grep -o 'value=[0-9.]*' | tr '\n' ' ') $(grep -o '[0-9]* events lost' /tmp/placement.err)"
}
for round in 1 2 3; do
    run untraced taskset -c $W $TINY
    [ -n "$SIB" ] && run save-tracer-on-sibling taskset -c $SIB $PY -m ebpf_cuda $P --save /tmp/p.bin -- taskset -c $W $TINY
    run save-tracer-on-other-core taskset -c $OTHER $PY -m ebpf_cuda $P --save /tmp/p.bin -- taskset -c $W $TINY
    run save-tracer-unpinned $PY -m ebpf_cuda $P --save /tmp/p.bin -- taskset -c $W $TINY
    [ -n "$SIB" ] && run text-tracer-on-sibling taskset -c $SIB $PY -m ebpf_cuda $P -o /dev/null -- taskset -c $W $TINY
    run text-tracer-on-other-core taskset -c $OTHER $PY -m ebpf_cuda $P -o /dev/null -- taskset -c $W $TINY
done
echo "calls per op (--summary of 20000 ops):"
$PY -m ebpf_cuda $P --summary -- $PY bench/gpu/torch_bench.py tiny --ops 20000 --reps 1 2>&1 | head -30
