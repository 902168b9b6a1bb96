"""Golden listings of the generated eBPF programs, as bpftrace keeps for its codegen.

For each variant below (the default set of functions traced the way the command traces by
default, and the main options), the programs the Tracer would load are those its Session
loads: chosen by probes/plan.py's `programs_for` (the one place that decides: rows sharing
a program by shape, --stacks on memory rows only, rows that teach kernel names always
emitting, ...) from the variant's TraceConfig and a fixed kernel (`Features`), generated
for x86-64, with nothing created or loaded in the kernel (no root needed). Each is
assembled, disassembled with ebpf_cuda/asm/disasm.py (map references by name, not fd) and
compared with the checked-in
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
from typing import Dict, List, NamedTuple

import pytest

from ebpf_cuda.spec import apis
from ebpf_cuda.spec.config import TraceConfig
from ebpf_cuda import asm
from ebpf_cuda.probes import follow, plan
from ebpf_cuda.arch import X86_64

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
REGENERATE = "UPDATE_GOLDEN=1 python3 -m pytest tests/test_golden.py"
MAX_DIFF_LINES = 400  # of all the diffs of one variant, in the failure message
ARCH = X86_64
# The tracepoint field offsets of Linux 6.18 (sched_process_fork's child_pid,
# sched_process_exit's group_dead): fixed here, read from tracefs by the real follower.
FORK_CHILD_PID_OFFSET = 20
EXIT_GROUP_DEAD_OFFSET = 32
THREAD_POINTER = 3128  # task_struct.thread.fsbase in 6.18's BTF (kernel_btf.py reads it)
SESSION_IS_RETURN = 65575  # bpf_session_is_return's BTF id in a 6.18 build (kernel_btf.py)
TASK_FIELDS = (1264, 1268, 1752)  # task_struct's pid, tgid, comm in a 6.18 build (kernel_btf.py)
# A kernel with everything: uprobe_multi (shared programs, function id from the attach
# cookie), task-local storage, uprobe sessions, the initial PID namespace.
KERNEL = plan.Features(ARCH, uprobe_multi=True, task_storage=True,
                       session_is_return=SESSION_IS_RETURN, thread_pointer=THREAD_POINTER,
                       task_fields=TASK_FIELDS)
COMMAND = ("COMMAND",)


class Variant(NamedTuple):
    what: str  # the command line (or API call) that traces this way
    config: TraceConfig  # as the Tracer is given it (the default ring: 4 MiB)
    kernel: plan.Features = KERNEL


VARIANTS = {
    "default": Variant("ebpf-cuda -- COMMAND", TraceConfig(command=COMMAND)),
    "no-returns": Variant("ebpf-cuda --no-returns -- COMMAND",
                          TraceConfig(command=COMMAND, return_probes=False)),
    "entries": Variant("ebpf-cuda --entries -- COMMAND",
                       TraceConfig(command=COMMAND, entries=True)),
    "stacks": Variant("ebpf-cuda --stacks -- COMMAND", TraceConfig(command=COMMAND, stacks=True)),
    "summary": Variant("ebpf-cuda --summary -- COMMAND (in-kernel aggregates, no records)",
                       TraceConfig(command=COMMAND, aggregate=True, emit=False)),
    "aggregate": Variant("Tracer(aggregate=True): in-kernel aggregates and records",
                         TraceConfig(command=COMMAND, aggregate=True)),
    "no-follow": Variant("ebpf-cuda --no-follow -- COMMAND (as with -p PID)",
                         TraceConfig(command=COMMAND, follow_children=False)),
    "inflight": Variant("ebpf-cuda -- COMMAND on a kernel without task storage",
                        TraceConfig(command=COMMAND), KERNEL._replace(task_storage=False)),
    "fn-ids": Variant("ebpf-cuda -f cudaMalloc,cudaLaunchKernel,cuModuleGetFunction -- COMMAND"
                      " on a kernel without uprobe_multi (one program per function)",
                      TraceConfig(command=COMMAND, functions=(
                          "cudaMalloc", "cudaLaunchKernel", "cuModuleGetFunction")),
                      KERNEL._replace(uprobe_multi=False)),
    "py-stacks": Variant("ebpf-cuda --py-stacks -f cudaMalloc,cudaLaunchKernel -- COMMAND "
                         "(6.18's task_struct.thread.fsbase at 3128)",
                         TraceConfig(command=COMMAND, functions=("cudaMalloc", "cudaLaunchKernel"),
                                     py_stacks=True)),
    "monitor": Variant("ebpf-cuda monitor (host-wide in-kernel aggregates; launch rows as "
                       "uprobe sessions sampling 1 return in 64: kernels with sessions)",
                       TraceConfig(aggregate=True, emit=False, emit_memory=True,
                                   sample_returns=64, per_process=True)),
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


def tracer_programs(variant: str) -> Dict[str, List[str]]:
    """{file name: lines} of the programs a Tracer of this variant loads (plan.programs_for,
    as the Session calls it)."""
    spec = VARIANTS[variant]
    rows = apis.select(spec.config.functions)
    if spec.config.functions is None:  # the default set: launches are probed in the driver only
        rows = [api for api in rows if not apis.driver_replaces(api)]
    files = {}
    for program in plan.programs_for(rows, spec.config, spec.kernel):
        instructions = program.instructions(ARCH)
        files["%s-%s.txt" % (program.kind, program.functions[0])] = _header(variant, [
            "# %s probe, %s, function id %s" % (
                program.kind, ARCH.name, "from the attach cookie" if program.shared
                else "a constant"),
            "# %s" % (program.options,),
            "# functions (%d): %s" % (len(program.functions), " ".join(program.functions)),
            "# %d instructions" % len([i for i in instructions
                                       if isinstance(i, asm.Instruction)]),
        ] + listing(instructions))
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
