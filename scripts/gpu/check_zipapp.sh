#!/usr/bin/env bash
# The one-file deployment on a GPU host that has neither pyelftools nor click: build the
# zipapp elsewhere (python3 -m ebpf_cuda.bundle -o ebpf-cuda.pyz), copy it over, then
#   PYZ=ebpf-cuda.pyz OUT=/some/dir scripts/gpu/check_zipapp.sh
# traces basic02 (checked by check_basic02.py) and writes a Perfetto timeline of a PyTorch
# run, which is parsed and summarised. Run with `python3 -I` so nothing installed is used.
set -u
cd "$(dirname "$0")/../.."
PYZ=${PYZ:-ebpf-cuda.pyz}
OUT=${OUT:-/tmp/check_zipapp}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p "$OUT"
status=0
python3 -I -c "import elftools" 2>/dev/null && echo "note: pyelftools is installed here"
python3 -I -c "import click" 2>/dev/null && echo "note: click is installed here"
"$NVCC" -O2 -o "$OUT/basic02" examples/basic02.cu || exit 2
python3 -I "$PYZ" --json -o "$OUT/zip-basic02.jsonl" -- "$OUT/basic02" || status=1
python3 -I scripts/check_basic02.py "$OUT/zip-basic02.jsonl" || status=1
python3 -I "$PYZ" --trace-out "$OUT/torch-timeline.json" -- \
    python3 scripts/gpu/torch_kernels.py --steps 3 || status=1
python3 -I - "$OUT/torch-timeline.json" <<'PY' || status=1
import collections, json, sys
trace = json.load(open(sys.argv[1]))
events = trace["traceEvents"] if isinstance(trace, dict) else trace
phases = collections.Counter(e.get("ph") for e in events)
launches = [e for e in events if e.get("ph") == "X" and "Launch" in e.get("name", "")
            + json.dumps(e.get("args", {}))]
named = [e for e in events if e.get("ph") == "X" and e.get("args", {}).get("kernel")]
print("timeline: %d events by phase %s; %d slices carry a kernel name"
      % (len(events), dict(phases), len(named)))
assert phases["X"] > 0 and phases["M"] > 0 and phases["C"] > 0, phases
PY
echo "check_zipapp: status $status"
exit $status
