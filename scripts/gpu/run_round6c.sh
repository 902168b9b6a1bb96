#!/bin/sh
# Issue 17: `--summary` alone against the decoded summary on the graphs targets, the
# compilers' caches off (scripts/gpu/graphs_summary_alone.py).
export PYTHONPATH=$PWD/ebpf-cuda.pyz
timeout 500 python3 scripts/gpu/graphs_summary_alone.py "python3 ebpf-cuda.pyz" $OUT/graphs > $OUT/graphs_summary_alone.log 2>&1; echo rc=$?
cut -c1-1200 $OUT/graphs_summary_alone.log
