#!/usr/bin/env bash
# The kernel matrix: boot each of Debian's kernels in QEMU (scripts/kernels.sh) and run
# scripts/kernel_checks.sh in it (features, the README quick start, `pytest -m kernel`).
# Prints each kernel's results, boot and run times, and exits non-zero if any kernel failed.
#
#   scripts/kernel_matrix.sh                  what CI runs (KERNEL_TESTS below)
#   KERNEL_TESTS=tests scripts/kernel_matrix.sh        every kernel-backed test (full run)
#   KERNELS="6.1" scripts/kernel_matrix.sh             one kernel
#
# KERNELS: the versions (default "6.1 6.12 5.10"; the host's own kernel runs the normal
# suite); arm64/VERSION: Debian's arm64 kernel of that version (scripts/kernels.sh --arch
# arm64), e.g. KERNELS="arm64/6.12" KERNEL_TESTS="tests/test_uprobe.py".
# KERNEL_TESTS: pytest arguments inside the guests (default: the CI subset below);
# KERNEL_TESTS_ARM64: those of the arm64 guests (default: KERNEL_TESTS, else ARM64_SUBSET).
# KERNEL_TESTS_5_10: those of the 5.10 guest (default: KERNEL_TESTS, else OLD_SUBSET).
# KERNEL_TIMEOUT: seconds one guest may run its checks (default 1800).
# KERNEL_CPUS: vCPUs of each guest (default: the cores shared out among the guests at once).
set -uo pipefail
cd "$(dirname "$0")/.."

# The CI subset: every attach path and its fallbacks, the ring buffer, following processes,
# the in-kernel summary, kernel names, the CLI end to end, signals and robustness, Python
# stacks (the thread pointer's offset comes from each kernel's BTF); what is
# left out (the remaining end-to-end rows and analyses: test_runtime_rows, test_driver_rows,
# test_analysis_e2e, test_layers, test_kernel_handles, test_real_cudart, test_robust_load,
# test_bundle, ...) runs with KERNEL_TESTS=tests.
CI_SUBSET="tests/test_syscalls.py tests/test_maps.py tests/test_programs.py
    tests/test_uprobe.py tests/test_follow.py tests/test_kernel_fallbacks.py
    tests/test_ringbuf.py tests/test_session.py tests/test_trace_e2e.py tests/test_hello.py
    tests/test_aggregates.py tests/test_cli.py tests/test_errors_cli.py
    tests/test_robust_processes.py tests/test_robust_signals.py tests/test_py_stacks_e2e.py"

# The arm64 guests' subset (emulating arm64 costs more; the quick starts run before it):
# the probes' registers, stack arguments and return values, the trace end to end, and
# Python stacks on the guest's own CPython (Debian 12's python3: the thread pointer from
# tp_value, pthread_self() below it by the guest glibc's constant; the pyenv ones skip).
ARM64_SUBSET="tests/test_uprobe.py tests/test_trace_e2e.py
    tests/test_py_stacks_e2e.py::test_every_call_carries_the_interpreters_own_stack"

# The 5.10 guest's subset (its whole CI subset took over 30 minutes under emulation): the
# paths that are its own (perf-event attach without links or cookies, calls in flight in the
# LRU map, no hello records), following, the in-kernel summary, the ring, the CLI's end to end;
# and kernel names without hello records: a process the monitor sees start, a launch site
# named by attach (a process is first seen at its first record here).
OLD_SUBSET="tests/test_kernel_fallbacks.py tests/test_trace_e2e.py tests/test_follow.py
    tests/test_aggregates.py tests/test_ringbuf.py tests/test_hello.py tests/test_uprobe.py
    tests/test_monitor.py::test_counts_of_processes_started_before_and_after_it
    tests/test_attach_names.py::test_a_launch_site_without_a_stub_is_shown_as_a_hint_and_counted"

kernels="${KERNELS:-6.1 6.12 5.10}"
tests="${KERNEL_TESTS:-$CI_SUBSET}"
arm64_tests="${KERNEL_TESTS_ARM64:-${KERNEL_TESTS:-$ARM64_SUBSET}}"
old_tests="${KERNEL_TESTS_5_10:-${KERNEL_TESTS:-$OLD_SUBSET}}"
timeout="${KERNEL_TIMEOUT:-1800}"
# Guests at once: TCG keeps about one host core busy per guest (pytest is one process), so on
# a 2-core machine two guests take little longer than one. KERNEL_JOBS=1: one at a time.
jobs="${KERNEL_JOBS:-$(( $(nproc) >= 2 ? 2 : 1 ))}"
# vCPUs per guest: the host's cores shared out (KERNEL_CPUS overrides). Two 2-vCPU guests on
# 2 cores starved their vCPUs: a grace period of RCU took minutes (6.12's hung-task warnings
# in perf_event_open, CI of 2026-12-01).
cpus="${KERNEL_CPUS:-$(( $(nproc) / jobs > 1 ? $(nproc) / jobs : 1 ))}"
results="$(mktemp -d)"
trap 'rm -rf "$results"' EXIT
# A stop (SIGTERM from CI's timeout, SIGHUP, Ctrl-C) reaches each guest's runner, which
# takes its QEMU down: no guest outlives the matrix.
runners=()
stop_all() {
    trap - TERM INT HUP
    [ "${#runners[@]}" -eq 0 ] || kill -TERM "${runners[@]}" 2>/dev/null
    wait
    exit 143
}
trap stop_all TERM INT HUP

run_one() {  # run_one VERSION: boots it, runs the checks; its log in $results/VERSION.log
    local version="$1" start status vm log these="$tests"
    log="$results/${version//\//-}"
    case "$version" in arm64/*) these="$arm64_tests" ;; 5.10*) these="$old_tests" ;; esac
    start=$(date +%s)
    # (in the background, and waited for: the TERM trap can then pass the stop on)
    # shellcheck disable=SC2086,SC2046  # $these, kernel_args: several words
    scripts/kernels.sh --timeout "$timeout" --cpus "$cpus" $(kernel_args "$version") \
        -- scripts/kernel_checks.sh $these > "$log.log" 2>&1 &
    vm=$!
    trap 'kill -TERM "$vm" 2>/dev/null; wait "$vm"; exit 143' TERM
    wait "$vm"
    status=$?
    echo "$version $status $(( $(date +%s) - start ))" > "$log.status"
    echo "=== kernel $version: exit $status after $(( $(date +%s) - start )) s"
}

kernel_args() {  # kernel_args VERSION: scripts/kernels.sh's words for it (arm64/6.12)
    case "$1" in
        arm64/*) echo "--arch arm64 ${1#arm64/}" ;;
        *) echo "$1" ;;
    esac
}

matrix_start=$(date +%s)
running=0
for version in $kernels; do
    # Fetch and unpack the kernel first, one at a time (apt and dpkg take locks).
    # shellcheck disable=SC2046  # (kernel_args: the words it prints)
    scripts/kernels.sh --fetch $(kernel_args "$version") >/dev/null \
        || echo "=== kernel $version: no package"
    echo "=== kernel $version: started"
    run_one "$version" &
    runners+=($!)
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
done
wait

failed=0
for version in $kernels; do
    echo
    echo "=== kernel $version: log"
    cat "$results/${version//\//-}.log"
done
echo
echo "=== kernel matrix ($(date -u +%Y-%m-%d), $(( $(date +%s) - matrix_start )) s in all)"
for version in $kernels; do
    log="$results/${version//\//-}"
    read -r _ status secs < "$log.status" || status=125
    [ "$status" -eq 0 ] || failed=1
    echo "--- $version: exit $status, ${secs:-?} s"
    grep -h "^kernel-checks:" "$log.log" | sed 's/^kernel-checks: /  /'
    grep -h "^kernel_vm: .*booted in\|^kernel_vm: .*exit status" "$log.log" \
        | sed 's/^kernel_vm: /  /'
done
exit "$failed"
