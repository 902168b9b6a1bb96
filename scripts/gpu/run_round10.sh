#!/bin/sh
# Issue 21 round 10, on the H200: the cost bounds measured in turns (monitor_turns.py: the
# three modes side by side, each process on its own copy of the CUDA libraries, taking
# turns rep by rep), then the monitor's counts and memory (monitor_h200.py). Run from the
# repository root with this build's zipapp carried:
#   sh scripts/gpu/run_round10.sh turns | counts | memory | all
# (memory: the counts under memory_profile.py, once as it runs and once with tracemalloc)
export PYTHONPATH=$PWD/ebpf-cuda.pyz
uname -r; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)" | head -2
case "$1" in
turns|all)
    OUT=$OUT timeout ${TURNS_S:-330} python3 scripts/gpu/monitor_turns.py --pyz ebpf-cuda.pyz \
        --rounds ${ROUNDS:-1200} --workloads ${WORKLOADS:-tiny,mlp} > $OUT/turns.log 2>&1
    echo rc=$?
    python3 -c 'import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line); r.pop("times", None); r.pop("host", None); r.pop("children", None)
        print(json.dumps(r)[:2500])' $OUT/turns.log ;;
esac
case "$1" in
counts|all)
    OUT=$OUT timeout ${COUNTS_S:-240} python3 scripts/gpu/monitor_h200.py --pyz ebpf-cuda.pyz \
        --parts counts,parallel --parallel ${PARALLEL:-4} > $OUT/monitor_counts.log 2>&1
    echo rc=$?
    grep -E '"part": "(start|counts|parallel|monitor)"' $OUT/monitor_counts.log | cut -c1-1500 ;;
esac
case "$1" in
memory)
    OUT=$OUT timeout ${COUNTS_S:-240} python3 scripts/gpu/monitor_h200.py --pyz ebpf-cuda.pyz \
        --parts counts,parallel --parallel ${PARALLEL:-4} --memory-profile > $OUT/memory_counts.log 2>&1
    echo rc=$?
    mv $OUT/memory_profile.jsonl $OUT/memory_profile_plain.jsonl
    OUT=$OUT MEMORY_PROFILE_FRAMES=8 timeout ${TRACED_S:-200} python3 scripts/gpu/monitor_h200.py \
        --pyz ebpf-cuda.pyz --parts counts --memory-profile > $OUT/memory_traced.log 2>&1
    echo rc=$?
    mv $OUT/memory_profile.jsonl $OUT/memory_profile_traced.jsonl
    grep -E '"part": "(start|monitor)"' $OUT/memory_counts.log | cut -c1-600
    python3 -c 'import json, sys
for path in sys.argv[1:]:
    print(path)
    for line in open(path):
        r = json.loads(line)
        if "when" in r:
            print(r["when"]); continue
        print(r["status_kib"], r["malloc"], r["pymalloc"], r.get("traced_kib"))
        for where, kib, count in r.get("top_kib", [])[:12]:
            print("   %6d KiB %7d  %s" % (kib, count, where[:200]))
        for where, kib, count in r.get("grew_kib", [])[:12]:
            print("  +%6d KiB %7d  %s" % (kib, count, where[:200]))' \
        $OUT/memory_profile_plain.jsonl $OUT/memory_profile_traced.jsonl ;;
esac
