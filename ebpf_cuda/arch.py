"""Per-architecture facts: syscall numbers and where registers sit in the uprobe context.

A uprobe program receives `struct pt_regs *` (arm64: `struct user_pt_regs *`); the offsets
below are byte offsets into that structure. Only x86-64 is tested; the arm64 row comes from
the uapi headers.
"""
import os
from typing import Dict, NamedTuple, Optional, Tuple

from .errors import UnsupportedKernelError


class Arch(NamedTuple):
    """One architecture's syscall numbers and `pt_regs` layout."""

    name: str
    machines: Tuple[str, ...]
    nr_bpf: int
    nr_perf_event_open: int
    args: Tuple[int, ...]  # pt_regs offsets of argument registers arg0, arg1, ...
    ret: int  # offset of the return-value register
    sp: int  # offset of the stack pointer
    ip: int  # offset of the instruction pointer
    pt_regs_size: int
    # Bytes between the entry stack pointer and the first stack argument: on x86-64 the
    # return address sits at [sp]; on arm64 the return address is in lr, so arguments start
    # right at sp.
    stack_args_start: int
    # Where a function's return address is at its entry: in the link register (arm64: x30,
    # this offset in pt_regs), or None: at [sp] (x86-64, pushed by `call`).
    link_register: Optional[int] = None
    # Where task_struct keeps a thread's user thread pointer (--py-stacks matches a thread's
    # PyThreadState by its pthread_self()): x86-64's fs base; arm64's TPIDR_EL0, saved at
    # clone and at each switch out.
    thread_pointer: Tuple[str, ...] = ("thread", "fsbase")
    # pthread_self() lies this glibc libthread_db constant's value below the thread pointer
    # (TLS_DTV_AT_TP: arm64's tls.h, CONST_THREAD_AREA(64, sizeof(struct pthread))), read
    # from the target's own C library; None: pthread_self() is the thread pointer (x86-64,
    # whose glibc has the symbol too, meaning another thing: the FS register's number).
    thread_self_symbol: Optional[str] = None

    def arg(self, index: int) -> int:
        """Offset of register argument `index` (0-based) in pt_regs."""
        if not 0 <= index < len(self.args):
            raise ValueError("%s passes only %d arguments in registers, not argument %d"
                             % (self.name, len(self.args), index))
        return self.args[index]

    def stack_arg(self, k: int) -> int:
        """Offset from the entry stack pointer of the k-th (0-based) stack-passed argument."""
        if k < 0:
            raise ValueError("stack argument index must be >= 0, got %d" % k)
        return self.stack_args_start + 8 * k


X86_64 = Arch(
    name="x86_64",
    machines=("x86_64", "amd64"),
    nr_bpf=321,
    nr_perf_event_open=298,
    args=(112, 104, 96, 88, 72, 64),  # rdi rsi rdx rcx r8 r9
    ret=80,  # rax
    sp=152,
    ip=128,
    pt_regs_size=168,
    stack_args_start=8,
)

ARM64 = Arch(
    name="arm64",
    machines=("aarch64", "arm64"),
    nr_bpf=280,
    nr_perf_event_open=241,
    args=tuple(8 * n for n in range(8)),  # x0..x7
    ret=0,  # x0
    sp=248,
    ip=256,  # pc
    pt_regs_size=272,  # regs[31], sp, pc, pstate (uapi asm/ptrace.h: struct user_pt_regs)
    stack_args_start=0,
    link_register=240,  # x30 (lr); x29 (232) is the frame pointer
    thread_pointer=("thread", "uw", "tp_value"),
    thread_self_symbol="_thread_db_const_thread_area",
)

ARCHES: Dict[str, Arch] = {m: a for a in (X86_64, ARM64) for m in a.machines}


def for_machine(machine: str) -> Arch:
    """The table for a machine name (`uname -m`); UnsupportedKernelError if unknown."""
    try:
        return ARCHES[machine.lower()]
    except KeyError:
        raise UnsupportedKernelError(
            "unsupported CPU architecture %r: only x86-64 and arm64 are known" % machine
        ) from None


def current() -> Arch:
    """The table for the machine this process runs on."""
    return for_machine(os.uname().machine)
