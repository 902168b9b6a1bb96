"""Golden listings of the generated eBPF programs, as bpftrace keeps for its codegen.

For each variant below (the default set of functions traced the way the command traces by
default, and the main options), the programs the Tracer would load are generated from
probes.entry_program / return_program with the ProbeOptions the Tracer gives them (its
program generation replicated here: rows sharing a program by shape, --stacks on memory
rows only, rows that teach kernel names always emitting, and with aggregates the graph
rows too), for x86-64, with nothing created
or loaded in the kernel (no root needed). Each is assembled, disassembled with
ebpf_cuda/asm/disasm.py (map references by name, not fd) and compared with the checked-in
tests/golden/<variant>/<probe>-<function>.txt: one file per program, named after the first
function (table order) that runs it. The follower's two tracepoint programs are in
tests/golden/follow/.

A change to the generated code fails here with a unified diff per file. When the change is
meant, regenerate the listings and commit them with it (the diff then shows in review what
the change did to the bytecode):

    UPDATE_GOLDEN=1 python3 -m pytest tests/test_golden.py

It rewrites the files that differ, adds new ones and deletes those no longer generated.
"""
import difflib
import os
import re
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence

import pytest

from ebpf_cuda.spec import apis
from ebpf_cuda import asm
from ebpf_cuda.probes import follow, calls as probes
from ebpf_cuda.arch import X86_64

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
REGENERATE = "UPDATE_GOLDEN=1 python3 -m pytest tests/test_golden.py"
MAX_DIFF_LINES = 400  # of all the diffs of one variant, in the failure message
ARCH = X86_64
# As the Tracer: the probes wake the reader once 1/8 of the default 4 MiB ring waits, and
# the rows that teach kernel names always emit and wake it at once.
WAKEUP_BYTES = (4 << 20) // 8
NAMED_CATEGORIES = ("module",)
# The tracepoint field offsets of Linux 6.18 (sched_process_fork's child_pid,
# sched_process_exit's group_dead): fixed here, read from tracefs by the real follower.
FORK_CHILD_PID_OFFSET = 20
EXIT_GROUP_DEAD_OFFSET = 32
THREAD_POINTER = 3128  # task_struct.thread.fsbase in 6.18's BTF (kernel_btf.py reads it)
SESSION_IS_RETURN = 65575  # bpf_session_is_return's BTF id in a 6.18 build (kernel_btf.py)


class Variant(NamedTuple):
    what: str  # the command line (or API call) that traces this way
    functions: Optional[Sequence[str]] = None  # None: the default set, both layers
    return_probes: bool = True
    entries: bool = False
    stacks: bool = False
    aggregate: bool = False
    emit: bool = True
    follow: bool = True  # a command and its children (else one process, or every one)
    task_storage: bool = True  # the kernel has task-local storage (else the inflight map)
    uprobe_multi: bool = True  # shared programs, function id from the attach cookie
    py_stacks: bool = False  # the entry walks the Python stack (thread pointer at fp 3128)
    sample_returns: int = 0  # launch rows: uprobe sessions taking 1 return in N
    per_process: bool = False  # aggregates by process too (the monitor)


VARIANTS = {
    "default": Variant("ebpf-cuda -- COMMAND"),
    "no-returns": Variant("ebpf-cuda --no-returns -- COMMAND", return_probes=False),
    "entries": Variant("ebpf-cuda --entries -- COMMAND", entries=True),
    "stacks": Variant("ebpf-cuda --stacks -- COMMAND", stacks=True),
    "summary": Variant("ebpf-cuda --summary -- COMMAND (in-kernel aggregates, no records)",
                       aggregate=True, emit=False),
    "aggregate": Variant("Tracer(aggregate=True): in-kernel aggregates and records",
                         aggregate=True),
    "no-follow": Variant("ebpf-cuda --no-follow -- COMMAND (as with -p PID)", follow=False),
    "inflight": Variant("ebpf-cuda -- COMMAND on a kernel without task storage",
                        task_storage=False),
    "fn-ids": Variant("ebpf-cuda -f cudaMalloc,cudaLaunchKernel,cuModuleGetFunction -- COMMAND"
                      " on a kernel without uprobe_multi (one program per function)",
                      functions=("cudaMalloc", "cudaLaunchKernel", "cuModuleGetFunction"),
                      uprobe_multi=False),
    "py-stacks": Variant("ebpf-cuda --py-stacks -f cudaMalloc,cudaLaunchKernel -- COMMAND "
                         "(6.18's task_struct.thread.fsbase at 3128)",
                         functions=("cudaMalloc", "cudaLaunchKernel"), py_stacks=True),
    "monitor": Variant("ebpf-cuda monitor (host-wide in-kernel aggregates; launch rows as "
                       "uprobe sessions sampling 1 return in 64: kernels with sessions)",
                       aggregate=True, emit=False, follow=False, sample_returns=64,
                       per_process=True),
}


def listing(instructions: List[object]) -> List[str]:
    """The disassembly of the assembled bytes, map fds replaced by the maps' names."""
    names = sorted(asm.map_names(instructions))
    fds = {name: 1000 + i for i, name in enumerate(names)}
    by_fd = {str(fd): name for name, fd in fds.items()}
    text = asm.disassemble(asm.assemble(instructions, maps=fds))
    return re.sub(r"\[fd (\d+)\]", lambda m: "[%s]" % by_fd[m.group(1)], text).splitlines()


def _header(variant: str, lines: List[str]) -> List[str]:
    return ["# Golden listing (tests/test_golden.py); regenerate: %s" % REGENERATE,
            "# variant %s: %s" % (variant, VARIANTS[variant].what if variant in VARIANTS
                                  else "the follower's tracepoint programs")] + lines


class _Generated(NamedTuple):
    kind: str
    options: probes.ProbeOptions
    instructions: list
    functions: List[str]


def tracer_programs(variant: str) -> Dict[str, List[str]]:
    """{file name: lines} of the programs a Tracer of this variant generates, chosen as its
    `_generate_programs` does (keep the two in step)."""
    spec = VARIANTS[variant]
    wanted = apis.select(spec.functions)
    if spec.functions is None:  # the default set: launches are probed in the driver only
        wanted = [api for api in wanted if not apis.driver_replaces(api)]
    names = {api.name for api in wanted}
    plain = probes.ProbeOptions(stash=spec.return_probes, emit_entry=spec.entries,
                                emit=spec.emit, aggregate=spec.aggregate, follow=spec.follow,
                                task_storage=spec.task_storage, wakeup_bytes=WAKEUP_BYTES,
                                py_stacks=THREAD_POINTER if spec.py_stacks else None,
                                per_process=spec.per_process)
    with_stack = plain._replace(stacks=True)
    shared = spec.uprobe_multi
    loaded: Dict[object, _Generated] = {}
    for fn_id, api in enumerate(apis.TABLE):
        if api.name not in names:
            continue
        kinds = [(False, "entry", probes.entry_program)]
        if spec.return_probes:
            kinds.append((True, "return", probes.return_program))
        options = with_stack if spec.stacks and api.category == "memory" else plain
        if api.category in NAMED_CATEGORIES:  # (cuKernelGetFunction: no wakeup)
            options = options._replace(emit=True, wake_now=api.learn_alias is None)
        elif spec.aggregate and api.category == "graph":  # (the summary follows graphs)
            options = options._replace(emit=True)
        if spec.sample_returns and api.role == apis.Role.LAUNCH and not options.emit:
            options = options._replace(sample_returns=spec.sample_returns,
                                       is_return_kfunc=SESSION_IS_RETURN)
            kinds = [("session", "session", probes.session_program)]
        for retprobe, kind, generate in kinds:
            by_shape = shared and kind != "session"  # (a session program per function)
            key = ((probes.shape_of(api, retprobe is True, ARCH, options.aggregate), options,
                    retprobe) if by_shape else (fn_id, retprobe))
            if key not in loaded:
                loaded[key] = _Generated(
                    kind, options,
                    generate(api, probes.FROM_COOKIE if by_shape else fn_id, ARCH, options),
                    [])
            loaded[key].functions.append(api.name)
    files = {}
    for program in loaded.values():
        files["%s-%s.txt" % (program.kind, program.functions[0])] = _header(variant, [
            "# %s probe, %s, function id %s" % (
                program.kind, ARCH.name, "from the attach cookie"
                if shared and program.kind != "session" else "a constant"),
            "# %s" % (program.options,),
            "# functions (%d): %s" % (len(program.functions), " ".join(program.functions)),
            "# %d instructions" % len([i for i in program.instructions
                                       if isinstance(i, asm.Instruction)]),
        ] + listing(program.instructions))
    return files


def follower_programs() -> Dict[str, List[str]]:
    return {
        "fork.txt": _header("follow", ["# sched_process_fork, child_pid at offset %d"
                                       % FORK_CHILD_PID_OFFSET]
                            + listing(follow.on_fork(FORK_CHILD_PID_OFFSET))),
        "exit.txt": _header("follow", ["# sched_process_exit, group_dead at offset %d"
                                       % EXIT_GROUP_DEAD_OFFSET]
                            + listing(follow.on_exit(EXIT_GROUP_DEAD_OFFSET))),
    }


def check(folder: str, files: Dict[str, List[str]]) -> None:
    """Compare (or, with UPDATE_GOLDEN=1, write) tests/golden/<folder>/*.txt."""
    where = GOLDEN / folder
    present = {p.name for p in where.glob("*.txt")} if where.is_dir() else set()
    if UPDATE:
        where.mkdir(parents=True, exist_ok=True)
        for name, lines in files.items():
            text = "\n".join(lines) + "\n"
            path = where / name
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
        for name in present - set(files):
            (where / name).unlink()
        return
    problems: List[str] = []
    diff_lines: List[str] = []
    for name in sorted(set(files) | present):
        shown = "tests/golden/%s/%s" % (folder, name)
        if name not in present:
            problems.append("%s: generated, but not checked in" % shown)
            continue
        if name not in files:
            problems.append("%s: checked in, but no longer generated" % shown)
            continue
        want = (where / name).read_text().splitlines()
        if want != files[name]:
            problems.append("%s: differs" % shown)
            diff_lines += difflib.unified_diff(want, files[name], shown + " (checked in)",
                                               shown + " (generated)", lineterm="")
    if problems:
        if len(diff_lines) > MAX_DIFF_LINES:
            diff_lines = diff_lines[:MAX_DIFF_LINES] + [
                "... %d more diff lines" % (len(diff_lines) - MAX_DIFF_LINES)]
        pytest.fail("generated programs differ from their golden listings:\n%s\n\n%s\n\n"
                    "If the change is intended, regenerate with: %s"
                    % ("\n".join(problems), "\n".join(diff_lines), REGENERATE), pytrace=False)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_generated_programs_match_their_golden_listings(variant):
    check(variant, tracer_programs(variant))


def test_follower_programs_match_their_golden_listings():
    check("follow", follower_programs())


def test_every_golden_folder_is_a_variant():
    folders = {p.name for p in GOLDEN.iterdir() if p.is_dir()} if GOLDEN.is_dir() else set()
    assert folders <= set(VARIANTS) | {"follow"}, "stale: %s" % (
        folders - set(VARIANTS) - {"follow"})


def test_listings_name_maps_and_are_deterministic():
    files = tracer_programs("default")
    assert files == tracer_programs("default")
    text = "\n".join(line for lines in files.values() for line in lines)
    assert "fd " not in text and "r1 = map[events]" in text and "map[tasks]" in text
