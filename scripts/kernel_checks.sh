#!/usr/bin/env bash
# What the kernel matrix runs inside each guest (scripts/kernel_matrix.sh boots them):
#   1. the kernel's features as the tracer finds them (one line);
#   2. the README's quick start, `ebpf-cuda -- python3 examples/cuda_calls.py`: it must exit
#      0 and trace the example's calls (text, then JSON, then the in-kernel summary);
#   3. the kernel-backed tests, `pytest -m kernel` over PYTEST_ARGS (default: all of tests/).
# Prints one `kernel-checks:` line per step and exits non-zero if any failed.
#
#   scripts/kernel_checks.sh [PYTEST_ARGS...]     (also runs on the host as it is)
set -uo pipefail
cd "$(dirname "$0")/.."
release="$(uname -r)"
failed=0
step() { echo "kernel-checks: $release: $*"; }

features="$(python3 -c 'from ebpf_cuda.bpf import features; print(features.report())' 2>&1)" \
    || failed=1
step "$features"
step "$(python3 -c 'from ebpf_cuda.bpf import features as f
print("uretprobe system call: %s; seen by seccomp filters: %s" % (
    "yes" if f._uretprobe_call_kills(False) else "no",
    "yes" if f.uretprobe_syscall_filtered() else "no"))' 2>&1)"

quick() {  # quick NAME EXPECTED_PATTERN ebpf-cuda-args...
    local name="$1" pattern="$2" out status start
    shift 2
    start=$(date +%s.%N)
    out="$(python3 -m ebpf_cuda "$@" -- python3 examples/cuda_calls.py 2>&1)"
    status=$?
    local secs
    secs=$(python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" \
           "$start" "$(date +%s.%N)")
    if [ "$status" -eq 0 ] && grep -Eq "$pattern" <<<"$out"; then
        step "quick start $name: ok (${secs} s)"
    else
        step "quick start $name: FAILED (exit $status, ${secs} s)"
        sed 's/^/    /' <<<"$out" | tail -n 25
        failed=1
    fi
}
quick text 'cudaMalloc +\[EXIT\] returned=' -t
quick json '"api": *"cudaMalloc", *"phase": *"exit"' --json
quick summary '[0-9] +cudaMalloc$' --summary
# The spool in a $TMPDIR whose file system may refuse O_TMPFILE (in the guests the
# repository is an overlay, which takes O_TMPFILE from 6.6 on only).
mkdir -p .kernel-checks-tmp
TMPDIR="$PWD/.kernel-checks-tmp" quick "text, spool in $PWD" 'cudaMalloc +\[EXIT\] returned=' -t -v
rm -rf .kernel-checks-tmp

start=$(date +%s)
if [ $# -eq 0 ]; then set -- tests; fi
python3 -m pytest -q -m kernel -p no:cacheprovider -rfE "$@" 2>&1 | tee /tmp/kernel-checks.pytest
status=${PIPESTATUS[0]}
summary="$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped)' /tmp/kernel-checks.pytest | tail -n 1 \
           | sed 's/=//g; s/^ *//; s/ *$//')"
step "pytest -m kernel: ${summary:-no summary} (exit $status, $(( $(date +%s) - start )) s)"
[ "$status" -eq 0 ] || failed=1
exit "$failed"
