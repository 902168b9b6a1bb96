#!/bin/sh
# The round's second GPU batch: each event's device and torch's one-rank reduce-scatter
# (devices_check.py), then the monitor's cost against untraced and bare probes
# (monitor_h200.py --parts overhead). Run from the repository root, the zipapp carried.
export PYTHONPATH=$PWD/ebpf-cuda.pyz
echo "== devices"
timeout 150 python3 scripts/gpu/devices_check.py "python3 ebpf-cuda.pyz" $OUT/devices > $OUT/devices.json 2>&1; echo rc=$?
cat $OUT/devices.json | cut -c1-3000
echo "== monitor overhead"
OUT=$OUT timeout 300 python3 scripts/gpu/monitor_h200.py --pyz ebpf-cuda.pyz --parts overhead --rounds 2 > $OUT/overhead.log 2>&1; echo rc=$?
tail -5 $OUT/overhead.log | cut -c1-3000
