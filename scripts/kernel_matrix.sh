#!/usr/bin/env bash
# The kernel matrix: boot each of Debian's kernels in QEMU (scripts/kernels.sh) and run
# scripts/kernel_checks.sh in it (features, the README quick start, `pytest -m kernel`).
# Prints each kernel's results, boot and run times, and exits non-zero if any kernel failed.
#
#   scripts/kernel_matrix.sh                  what CI runs (KERNEL_TESTS below)
#   KERNEL_TESTS=tests scripts/kernel_matrix.sh        every kernel-backed test (full run)
#   KERNELS="6.1" scripts/kernel_matrix.sh             one kernel
#
# KERNELS: the versions (default "6.1 6.12"; the host's own kernel runs the normal suite).
# KERNEL_TESTS: pytest arguments inside the guests (default: the CI subset below).
# KERNEL_TIMEOUT: seconds one guest may run its checks (default 1800).
set -uo pipefail
cd "$(dirname "$0")/.."

# The CI subset: every attach path and its fallbacks, the ring buffer, following processes,
# the in-kernel summary, kernel names, the CLI end to end, signals and robustness; what is
# left out (the remaining end-to-end rows and analyses: test_runtime_rows, test_driver_rows,
# test_analysis_e2e, test_layers, test_kernel_handles, test_real_cudart, test_robust_load,
# test_bundle, ...) runs with KERNEL_TESTS=tests.
CI_SUBSET="tests/test_syscalls.py tests/test_maps.py tests/test_programs.py
    tests/test_uprobe.py tests/test_follow.py tests/test_kernel_fallbacks.py
    tests/test_ringbuf.py tests/test_session.py tests/test_trace_e2e.py tests/test_hello.py
    tests/test_aggregates.py tests/test_cli.py tests/test_errors_cli.py
    tests/test_robust_processes.py tests/test_robust_signals.py"

kernels="${KERNELS:-6.1 6.12}"
tests="${KERNEL_TESTS:-$CI_SUBSET}"
timeout="${KERNEL_TIMEOUT:-1800}"
results="$(mktemp -d)"
trap 'rm -rf "$results"' EXIT
failed=0
for version in $kernels; do
    echo "=== kernel $version"
    start=$(date +%s)
    # shellcheck disable=SC2086  # $tests: several pytest arguments
    scripts/kernels.sh --timeout "$timeout" --times "$results/times" "$version" -- \
        scripts/kernel_checks.sh $tests 2>&1 | tee "$results/$version.log"
    status=${PIPESTATUS[0]}
    echo "$version $status $(( $(date +%s) - start ))" >> "$results/status"
    [ "$status" -eq 0 ] || failed=1
done

echo
echo "=== kernel matrix ($(date -u +%Y-%m-%d))"
while read -r version status secs; do
    echo "--- $version: exit $status, ${secs} s in all"
    grep -h "^kernel-checks:" "$results/$version.log" | sed 's/^kernel-checks: /  /'
    grep -h "^kernel_vm: .*exit status" "$results/$version.log" | sed 's/^kernel_vm: /  /'
done < "$results/status"
exit "$failed"
