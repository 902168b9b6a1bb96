#!/usr/bin/env bash
# The GPU check suite of ebpf-cuda: one command, on a GPU host, as root.
#
#   bash scripts/gpu/run.sh [--out DIR] [--work DIR] [--pyz FILE] [--budget SECONDS] [CHECK ...]
#   bash scripts/gpu/run.sh --list
#
# No CHECK: every check, in the order of --list. Each check compares the tracer's output with
# a ground truth that does not come from the tracer (CUPTI through torch.profiler in the
# traced process, what a program says it did, the interpreter's own stack, untraced runs in
# the same turns) and prints one line per comparison:
#   PASS <check>/<part>: <the numbers compared>
#   FAIL <check>/<part>: <the mismatch>
#   SKIP <check>/<part>: <why: a framework not installed, no nvcc, out of budget>
# A check FAILs on any FAIL line, a non-zero exit or its time limit; it is SKIPped when it
# could not run at all (never a PASS then).
#
# The tracer runs from the zipapp (the GPU host has neither pyelftools nor click): build it
# where they are installed, `python3 -m ebpf_cuda.bundle -o ebpf-cuda.pyz` in the
# repository's root, and carry it (default --pyz: ./ebpf-cuda.pyz; built here when missing
# and this Python can). Every check gets PYTHONPATH=PYZ and TRACER="python3 PYZ".
#
# Outputs: --out DIR (default $OUT, else build/gpu-suite) gets three files: summary.txt (one
# line per check, then its FAIL and SKIP lines), suite.log (every verdict and INFO line, as
# printed) and logs.tar.gz (each check's full log and its small result files). Traces and
# builds stay in --work DIR (default /tmp/ebpf-cuda-gpu-suite). --budget SECONDS: checks
# that no longer fit (by their estimate) are SKIPped, and none runs past it. Exit status: 0
# when no check failed, 1 otherwise, 2 on a usage error.
#
# Knobs (environment): KERNEL_CASES (kernels: eager cudagraph compile triton cupy jax numba),
# GRAPH_CASES (cudagraph compile), MEMORY_CASES (torch jax attach), ATTACH_MODES (eager; compile too; stacks: a diagnostic), LINES_COST_ROUNDS (0:
# the py-stacks cost runs left out), PARALLEL (monitor: MLP children at once, 4),
# MONITOR_ROUNDS (monitor-cost, 600), NVML_COST_TURNS (nvml: the sampler's cost turns, 3), OVERHEAD_ROUNDS (overhead, 400), NVCC, NVCC_ARCH
# (-arch=native), PYTHON (python3).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-python3}

# name|estimate s|limit s|what it compares, against what (in the order they run: what the
# kernels and attach show first, then the short deterministic checks, the longer ones, the
# cost measurements last)
CHECK_TABLE='kernels|200|480|kernel names, launches, geometry of PyTorch eager, CUDA graphs, torch.compile, Triton, CuPy, JAX, numba = CUPTI in the same process (issue 40)
attach|60|240|-d PID to a warmed-up PyTorch loop: window launches and geometry = CUPTI; runtime-launched kernels >= 99 % named with CUPTI names
memory|100|300|the tracer'"'"'s VmHWM <= 64 MB (its own: --gpu-samples 0; with the GPU'"'"'s state INFO) tracing PyTorch and JAX from their start and attached to a PyTorch loop; no kernel name said lost in their import bursts (issue 36)
driver-api|25|120|driver_check.cu (runtime + driver API, stream capture, graphs, a PTX module): launches, captured, nodes, names, geometry = what the program says it did
summary|30|120|kernels_check.cu (static and shared cudart): --summary/--leaks tables and JSON names, copies, leak = the program'"'"'s known operations
targets|45|180|basic02 (static and shared cudart) traced as -- COMMAND, -p PATH system-wide, -d PID: sizes, pointers, copies, geometry, name = what basic02 does
late-load|20|120|CuPy'"'"'s runtime, linked into modules loaded later: cudaMalloc/cudaFree/cudaDeviceSynchronize = the program'"'"'s known counts
zipapp|40|180|python3 -I PYZ (nothing installed used): basic02 = what it does; a Chrome timeline'"'"'s launch slices = the same run'"'"'s JSON launches
nccl|60|300|torch.distributed NCCL calls = what the script issued (order, counts, dtypes, bytes, DDP gradient bytes, comm id and sequence); saved-trace reports
nvml|150|420|GPU state beside a traced PyTorch loop (--gpu-samples): live allocations = memory_reserved(), NVML process memory = that + the gap, device memory = nvidia-smi, utilisation high in the loop and low in its sleep, GPM on Hopper, the sampler'"'"'s cost on the step time (issue 37)
lines|100|360|--py-stacks: each call on the line of the loop that made it (lines known by construction); CI target: py_stack = the interpreter'"'"'s own stack
graphs|150|420|CUDA graphs node by node (CUDAGraph, torch.compile reduce-overhead): kernels and copies = CUPTI, checksums = untraced run, --summary alone = decoded table
analyze|150|540|--analyze on PyTorch loops: planted .item(), pageable non_blocking copy, empty_cache found at their lines, once each, and nothing else; steps = iterations; CUDA graph and torch.compile replays attributed to the capturing line, each step'"'"'s mode (warm-up, capture, graph; eager for a compiled loop that never replays); graphs would save vs measured (issue 38)
monitor|110|300|ebpf-cuda monitor beside PyTorch, torch.compile, CuPy and 4 MLPs at once: launches = CUPTI / the loop'"'"'s count, cudaMalloc = PyTorch'"'"'s allocator statistics, 0 unnamed; the GPU state'"'"'s cost: idle scrape with it <= 1.5x + 2 ms without, memory with and without and NVML'"'"'s by step (INFO)
monitor-cost|150|420|the monitor in turns on its own library copies: tiny op <= 1.02x bare entry probes, MLP step <= 1.02x untraced (issue 21)
overhead|150|420|the CLI tracer in turns: tiny op and MLP step trace <= 1.05x (issue 36), --summary <= 1.05x a bare probe pair; MLP step <= 1.03x untraced (issue 7)'

names() { printf '%s\n' "$CHECK_TABLE" | cut -d'|' -f1; }
field() { printf '%s\n' "$CHECK_TABLE" | awk -F'|' -v n="$1" -v f="$2" '$1 == n {print $f}'; }

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

# -- the checks (each runs in $W, its own work folder; its output goes to its log) -----------

verdict() {  # verdict PASS|FAIL|SKIP CHECK/PART DETAIL...
    local word=$1 part=$2; shift 2
    echo "$word $part: $*"
}

combine() {  # the status of several parts: 1 if one failed, 77 if all were skipped, else 0
    local any_ok=0 s
    for s in "$@"; do
        case $s in 0) any_ok=1 ;; 77) ;; *) return 1 ;; esac
    done
    [ $any_ok = 1 ] && return 0 || return 77
}

need_nvcc() {  # need_nvcc CHECK: SKIP the check without nvcc
    if [ -x "$NVCC" ] || command -v "$NVCC" >/dev/null 2>&1; then return 0; fi
    verdict SKIP "$1/all" "no nvcc here (NVCC=$NVCC)"
    return 77
}

build() {  # build OUT SOURCE [FLAGS...]: nvcc, with NVCC_ARCH unless it fails
    local out=$1 src=$2; shift 2
    "$NVCC" -O2 $NVCC_ARCH -o "$out" "$src" "$@" 2>"$out.build.err" \
        || "$NVCC" -O2 -o "$out" "$src" "$@" 2>>"$out.build.err" \
        || { cat "$out.build.err"; return 1; }
}

check_kernels() {
    "$PY" "$HERE/kernels_cupti.py" --out "$W" ${KERNEL_CASES:-}
}

check_attach() {
    "$PY" "$HERE/attach_check.py" --out "$W" ${ATTACH_MODES:-eager}
}

check_memory() {
    "$PY" "$HERE/memory_check.py" --out "$W" ${MEMORY_CASES:-}
}

check_graphs() {
    "$PY" "$HERE/graphs_check.py" --out "$W" ${GRAPH_CASES:-}
}

check_lines() {
    "$PY" "$HERE/py_stacks_check.py" --out "$W/loop" --tracer "$TRACER" \
        --rounds "${LINES_COST_ROUNDS:-0}"
    local loop=$?
    "$PY" "$HERE/py_stacks_target_check.py" --out "$W/target"
    combine $loop $?
}

check_analyze() {
    "$PY" "$HERE/analyze_check.py" --out "$W" --tracer "$TRACER"
}

check_nccl() {
    "$PY" "$HERE/nccl_check.py" --out "$W"
}

check_nvml() {
    "$PY" "$HERE/nvml_check.py" --out "$W" --turns "${NVML_COST_TURNS:-3}"
}

check_driver_api() {
    need_nvcc driver-api || return 77
    local root  # (libcuda's link-time stub, where the linker finds no libcuda.so)
    root=$(dirname "$(dirname "$(readlink -f "$(command -v "$NVCC" || echo "$NVCC")")")")
    build "$W/driver_check" "$HERE/driver_check.cu" -L"$root/lib64/stubs" \
        -L/usr/local/cuda/lib64/stubs -lcuda \
        || { verdict FAIL driver-api/build "nvcc failed"; return 1; }
    "$W/driver_check" > "$W/untraced.out" 2>&1
    verdict "$([ "$(tail -n 1 "$W/untraced.out")" = ok ] && echo PASS || echo FAIL)" \
        driver-api/untraced "driver_check alone ends with: $(tail -n 1 "$W/untraced.out")"
    $TRACER --json -o "$W/driver_check.jsonl" -- "$W/driver_check" > "$W/traced.out" \
        2> "$W/traced.err"
    local rc=$?
    [ $rc = 0 ] || verdict FAIL driver-api/traced "the traced run exited $rc: $(tail -n 3 "$W/traced.err")"
    "$PY" "$HERE/gpucheck.py" driver-api "$W/driver_check.jsonl" "$W/traced.out"
}

check_summary() {
    need_nvcc summary || return 77
    local vecadd="vecAdd(float const*, float const*, float*, int)"
    local scale="void nn::scale<float>(float*, float, int)"
    local status=0 mode exe
    for mode in static shared; do
        exe="$W/kernels_check_$mode"
        build "$exe" "$HERE/kernels_check.cu" -g -cudart "$mode" \
            || { verdict FAIL "summary/$mode" "nvcc failed"; status=1; continue; }
        $TRACER --summary --leaks --stacks -- "$exe" > "$W/summary_$mode.txt" \
            2> "$W/summary_$mode.err"
        local rc=$? missing=""
        grep -q "kernels_check: result ok" "$W/summary_$mode.txt" || missing="$missing; result not ok"
        grep -qF "$vecadd" "$W/summary_$mode.txt" || missing="$missing; $vecadd not in the kernel table"
        grep -qF "$scale" "$W/summary_$mode.txt" || missing="$missing; $scale not in the kernel table"
        grep -q "1,048,576  cudaMalloc" "$W/summary_$mode.txt" || missing="$missing; the 1 MiB leak not reported"
        grep -q "Leaks: 1 of 4 allocations never freed" "$W/summary_$mode.txt" \
            || missing="$missing; not 'Leaks: 1 of 4 allocations never freed'"
        if [ $rc = 0 ] && [ -z "$missing" ]; then
            verdict PASS "summary/$mode tables" "exit 0; both kernels in the kernel table; the 1 MiB leak of 4 allocations reported"
        else
            verdict FAIL "summary/$mode tables" "exit $rc$missing"; status=1
        fi
        $TRACER --json -o "$W/kernels_$mode.jsonl" -- "$exe" > /dev/null 2> "$W/json_$mode.err"
        "$PY" "$HERE/check_trace.py" "$W/kernels_$mode.jsonl" --min-resolved 1.0 \
            --expect-kernel "$vecadd" --expect-kernel "$scale" --expect-leak 1048576 \
            --expect-copy HostToDevice=8388608 --expect-copy DeviceToHost=4194304 \
            --expect-copy DeviceToDevice=2097152 > "$W/check_trace_$mode.txt" 2>&1
        rc=$?
        cat "$W/check_trace_$mode.txt"
        if [ $rc = 0 ]; then
            verdict PASS "summary/$mode json" "$(head -n 1 "$W/check_trace_$mode.txt" | sed 's/^[^:]*: //'); names, copies (8 MiB H2D, 4 MiB D2H, 2 MiB D2D) and the leak as expected"
        else
            verdict FAIL "summary/$mode json" "$(grep '^FAIL' "$W/check_trace_$mode.txt" | tr '\n' ' ')"
            status=1
        fi
    done
    return $status
}

check_targets() {
    need_nvcc targets || return 77
    local status=0 kind bin path tracer rc
    for kind in static shared; do
        bin="$W/basic02-$kind"
        build "$bin" "$REPO/examples/basic02.cu" -cudart "$kind" \
            || { verdict FAIL "targets/$kind" "nvcc failed"; status=1; continue; }
        $TRACER -v -- "$bin" > "$W/$kind-text.txt" 2>&1
        rc=$?
        if [ $rc = 0 ] && grep -q "Launch.*\[EXIT\]" "$W/$kind-text.txt" \
                && grep -q "cudaFree.*\[EXIT\]" "$W/$kind-text.txt"; then
            verdict PASS "targets/$kind text" "-- COMMAND, text: exit 0, launch and frees printed"
        else
            verdict FAIL "targets/$kind text" "-- COMMAND, text: exit $rc; $(tail -n 2 "$W/$kind-text.txt" | tr '\n' ' ')"
            status=1
        fi
        for how in command path pid; do
            out="$W/$kind-$how.jsonl"
            case $how in
            command) $TRACER --json -o "$out" -- "$bin" > /dev/null 2> "$W/$kind-$how.err" ;;
            path)
                path=$bin
                [ "$kind" = shared ] && path=$(ldd "$bin" | awk '/libcudart/ {print $3}')
                $TRACER --json -o "$out" -p "$path" 2> "$W/$kind-$how.err" &
                tracer=$!
                for _ in $(seq 100); do  # (its probes on: it says so)
                    grep -q "probing" "$W/$kind-$how.err" 2>/dev/null && break
                    sleep 0.1
                done
                "$bin" > /dev/null
                sleep 1
                # (TERM: a background job of a script has SIGINT ignored, which the tracer keeps)
                kill -TERM $tracer
                for _ in $(seq 300); do kill -0 $tracer 2>/dev/null || break; sleep 0.1; done
                kill -KILL $tracer 2>/dev/null; wait $tracer ;;
            pid)
                "$bin" 3000 > "$W/$kind-pid.out" &
                local target=$!
                sleep 0.5
                $TRACER --json -o "$out" -d $target 2> "$W/$kind-$how.err"
                wait $target ;;
            esac
            if "$PY" "$REPO/scripts/check_basic02.py" "$out" > "$W/$kind-$how.check" 2>&1; then
                verdict PASS "targets/$kind $how" "$(grep -E 'launch (geometry|kernel name)' "$W/$kind-$how.check" | tr -s ' ' | tr '\n' ';')"
            else
                verdict FAIL "targets/$kind $how" "$(grep -v ' ok$' "$W/$kind-$how.check" | tr -s ' ' | tr '\n' ';')"
                status=1
            fi
        done
    done
    return $status
}

check_late_load() {
    if ! "$PY" -c "import cupy" 2>/dev/null; then
        verdict SKIP late-load/cupy "CuPy not installed here"; return 77
    fi
    $TRACER -v --json -o "$W/cupy.jsonl" --api runtime \
        --functions cudaMalloc,cudaFree,cudaDeviceSynchronize,cudaGetDeviceCount \
        -- "$PY" "$HERE/late_load/cupy_prog.py" 50 > "$W/cupy.out" 2> "$W/cupy.err"
    local rc=$?
    grep -E "probing|probed|watching|warning|error|lost|not probed" "$W/cupy.err" | head -20
    if [ $rc != 0 ] || ! grep -q "^ok 50" "$W/cupy.out"; then
        verdict FAIL late-load/run "exit $rc; $(tail -n 2 "$W/cupy.out" "$W/cupy.err" | tr '\n' ' ')"
        return 1
    fi
    "$PY" "$HERE/gpucheck.py" late-load "$W/cupy.jsonl" 50
}

check_zipapp() {
    need_nvcc zipapp || return 77
    local status=0
    "$PY" -I -c "import elftools" 2>/dev/null && echo "note: pyelftools is installed here"
    "$PY" -I -c "import click" 2>/dev/null && echo "note: click is installed here"
    build "$W/basic02" "$REPO/examples/basic02.cu" || { verdict FAIL zipapp/build "nvcc failed"; return 1; }
    "$PY" -I "$PYZ" --json -o "$W/basic02.jsonl" -- "$W/basic02" > /dev/null 2> "$W/basic02.err"
    if "$PY" -I "$REPO/scripts/check_basic02.py" "$W/basic02.jsonl" > "$W/basic02.check" 2>&1; then
        verdict PASS zipapp/basic02 "python3 -I PYZ --json: $(grep -E 'launch kernel name' "$W/basic02.check" | tr -s ' ')"
    else
        verdict FAIL zipapp/basic02 "$(grep -v ' ok$' "$W/basic02.check" | tr -s ' ' | tr '\n' ';') $(tail -n 2 "$W/basic02.err")"
        status=1
    fi
    if ! "$PY" -c "import torch" 2>/dev/null; then
        verdict SKIP zipapp/timeline "PyTorch not installed here"
        return $status
    fi
    "$PY" -I "$PYZ" --trace-out "$W/timeline.json" --json -o "$W/timeline.jsonl" -- \
        "$PY" "$HERE/torch_kernels.py" --steps 3 > "$W/timeline.out" 2> "$W/timeline.err"
    local rc=$?
    if [ $rc != 0 ]; then
        verdict FAIL zipapp/timeline "the traced run exited $rc: $(tail -n 3 "$W/timeline.err" | tr '\n' ' ')"
        return 1
    fi
    "$PY" "$HERE/gpucheck.py" timeline "$W/timeline.json" "$W/timeline.jsonl" || status=1
    rm -f "$W/timeline.jsonl"
    return $status
}

check_monitor() {  # (then what the GPU's state costs: a --no-gpu monitor, NVML by step)
    OUT=$W "$PY" "$HERE/monitor_h200.py" --pyz "$PYZ" --parts counts,parallel,gpu-memory \
        --parallel "${PARALLEL:-4}"
    local counts=$?
    OUT=$W "$PY" "$HERE/nvml_memory.py"
    combine $counts $?
}

check_monitor_cost() {
    OUT=$W "$PY" "$HERE/monitor_turns.py" --pyz "$PYZ" --rounds "${MONITOR_ROUNDS:-600}" \
        --check-bounds
}

check_overhead() {
    OUT=$W "$PY" "$HERE/trace_turns.py" --pyz "$PYZ" --rounds "${OVERHEAD_ROUNDS:-400}" \
        --check-bounds
}

# -- one check, in a process of its own (run.sh --one NAME WORKDIR) ---------------------------

if [ "${1:-}" = --one ]; then
    W=$3
    mkdir -p "$W"
    cd "$REPO" || exit 2
    "check_${2//-/_}"
    exit $?
fi

# -- the suite ---------------------------------------------------------------------------------

RESULTS=${OUT:-$REPO/build/gpu-suite}
WORK=/tmp/ebpf-cuda-gpu-suite
PYZ=${PYZ:-$REPO/ebpf-cuda.pyz}
BUDGET=
SELECTED=()
while [ $# -gt 0 ]; do
    case $1 in
    --list)
        printf '%s\n' "$CHECK_TABLE" | awk -F'|' '{printf "%-13s ~%4d s (limit %3d s)  %s\n", $1, $2, $3, $4}'
        exit 0 ;;
    --out) RESULTS=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --pyz) PYZ=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "run.sh: unknown option $1 (--help)" >&2; exit 2 ;;
    *)
        if [ -z "$(field "$1" 1)" ]; then
            echo "run.sh: no check named $1; the checks: $(names | tr '\n' ' ')" >&2; exit 2
        fi
        SELECTED+=("$1"); shift ;;
    esac
done
[ ${#SELECTED[@]} -gt 0 ] || mapfile -t SELECTED < <(names)
case $BUDGET in ''|*[!0-9]*) [ -z "$BUDGET" ] || { echo "run.sh: --budget takes seconds" >&2; exit 2; } ;; esac

mkdir -p "$RESULTS" "$WORK/logs" || exit 2
RESULTS=$(cd "$RESULTS" && pwd)
WORK=$(cd "$WORK" && pwd)
if [ ! -f "$PYZ" ]; then
    echo "run.sh: no zipapp at $PYZ: building it ($PY -m ebpf_cuda.bundle)"
    (cd "$REPO" && "$PY" -m ebpf_cuda.bundle -o "$PYZ") || {
        echo "run.sh: could not build $PYZ here: build it where pyelftools and click are" \
             "installed (python3 -m ebpf_cuda.bundle -o ebpf-cuda.pyz) and carry it" >&2
        exit 2; }
fi
PYZ=$(cd "$(dirname "$PYZ")" && pwd)/$(basename "$PYZ")
export PYZ PY
export PYTHONPATH="$PYZ${PYTHONPATH:+:$PYTHONPATH}"
export TRACER="$PY $PYZ"
export NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
export NVCC_ARCH=${NVCC_ARCH--arch=native}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1

SUITE_LOG=$RESULTS/suite.log
SUMMARY=$RESULTS/summary.txt
: > "$SUITE_LOG"
say() { echo "$*" | tee -a "$SUITE_LOG"; }

start=$(date +%s)
say "== ebpf-cuda GPU suite, $(date -u '+%Y-%m-%d %H:%M:%S UTC'); checks: ${SELECTED[*]}${BUDGET:+; budget $BUDGET s}"
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
say "== host: $(uname -r); ${gpu:-no nvidia-smi answer}; $(nproc) CPUs"
say "== $("$PY" -c 'import sys; print("python", sys.version.split()[0])' 2>&1); $("$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null || echo 'no torch')"
say "== zipapp $PYZ: $(sha256sum "$PYZ" | cut -c1-12); this checkout's git HEAD $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '(not a git checkout)') (the archive may have been built from other sources: its hash names it)"

declare -A STATUS SECONDS_TAKEN
failed=0
for name in "${SELECTED[@]}"; do
    estimate=$(field "$name" 2)
    limit=$(field "$name" 3)
    log=$WORK/logs/$name.log
    if [ -n "$BUDGET" ]; then
        left=$(( BUDGET - ($(date +%s) - start) ))
        if [ "$left" -lt "$estimate" ]; then
            say "SKIP $name/all: out of budget ($left s left, the check takes ~$estimate s)" \
                | tail -n 1 > "$log"
            STATUS[$name]=SKIP; SECONDS_TAKEN[$name]=0
            continue
        fi
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    say "== $name: $(field "$name" 4)"
    rm -rf "${WORK:?}/$name"
    t0=$(date +%s)
    set -o pipefail
    timeout -k 20 "$limit" bash "$HERE/run.sh" --one "$name" "$WORK/$name" 2>&1 | tee "$log" \
        | awk '/^(PASS|FAIL|SKIP|INFO) / {print substr($0, 1, 2000); fflush()}' \
        | tee -a "$SUITE_LOG"
    rc=${PIPESTATUS[0]}
    set +o pipefail
    took=$(( $(date +%s) - t0 ))
    SECONDS_TAKEN[$name]=$took
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        say "FAIL $name/all: stopped at its time limit of $limit s"
        STATUS[$name]=FAIL
    elif grep -q '^FAIL ' "$log"; then
        STATUS[$name]=FAIL
    elif [ "$rc" = 77 ] || { ! grep -q '^PASS ' "$log" && grep -q '^SKIP ' "$log"; }; then
        STATUS[$name]=SKIP
    elif [ "$rc" != 0 ]; then
        say "FAIL $name/all: exited $rc: $(grep -v '^INFO ' "$log" | tail -n 3 | tr '\n' ' ' | cut -c1-600)"
        STATUS[$name]=FAIL
    elif ! grep -q '^PASS ' "$log"; then
        say "FAIL $name/all: exited 0 but printed no verdict"
        STATUS[$name]=FAIL
    else
        STATUS[$name]=PASS
    fi
    [ "${STATUS[$name]}" = FAIL ] && failed=1
    say "== $name: ${STATUS[$name]} ($took s)"
done

{
    echo "ebpf-cuda GPU suite: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(( $(date +%s) - start )) s; $(grep '^== host' "$SUITE_LOG" | cut -c4-)"
    for name in "${SELECTED[@]}"; do
        printf '%-5s %-13s %4s s  %s\n' "${STATUS[$name]}" "$name" "${SECONDS_TAKEN[$name]}" "$(field "$name" 4)"
        [ -f "$WORK/logs/$name.log" ] && grep -E '^(FAIL|SKIP) ' "$WORK/logs/$name.log" \
            | cut -c1-600 | sed 's/^/      /'
    done
} > "$SUMMARY"
# every check's log and its small result files (traces and builds stay in $WORK)
(cd "$WORK" && find . -type f \( -name '*.log' -o -name '*.json' -o -name '*.jsonl' \
    -o -name '*.txt' -o -name '*.out' -o -name '*.err' -o -name '*.check' \) -size -4M \
    -print0 | tar -czf "$RESULTS/logs.tar.gz" --null -T -) 2>/dev/null
echo
cat "$SUMMARY"
echo "results: $SUMMARY, $SUITE_LOG, $RESULTS/logs.tar.gz; work files in $WORK"
exit $failed
