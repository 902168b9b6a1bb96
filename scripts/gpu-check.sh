#!/usr/bin/env bash
# gpu-check.sh: examples/basic02.cu built both ways nvcc links the CUDA runtime (static,
# shared) and traced every way the tracer can: -- COMMAND (text and JSON), -p PATH
# (system-wide, then run), -d PID (attach to a running one); each JSON trace checked by
# scripts/check_basic02.py. It is now the `targets` check of the GPU suite
# (scripts/gpu/run.sh, scripts/gpu/README.md), which this runs:
#
#   scripts/gpu-check.sh [OUTDIR]        (default OUTDIR: build/gpu-check)
#
# As root on a GPU host with nvcc; the tracer from ./ebpf-cuda.pyz (python3 -m
# ebpf_cuda.bundle -o ebpf-cuda.pyz; PYZ=FILE for another).
exec bash "$(dirname "$0")/gpu/run.sh" --out "${1:-build/gpu-check}" targets
