"""Reading a call's arguments at entry (registers, stack slots, structs behind pointers, the
caller's return address) and its out-parameters and learned names at return, as the table's
row says."""
from typing import List, NamedTuple, Tuple

from .. import asm
from ..arch import Arch
from ..asm import DW, FP, R0, R1, R2, R3, R4, R7, R8, R9, B, Helper, W
from ..spec import layout, record
from ..spec.apis import Api, Kind, arg_cells

Items = List[object]


def in_registers(api: Api, arch: Arch) -> bool:
    """Whether every argument of `api` is a register whose slot is its cell: then the entry
    copies all argument registers, whatever the row uses (one program for many rows)."""
    return all(cell == arg.slot and not arg.deref and arg.slot + arg.cells <= len(arch.args)
               for arg, cell in arg_cells(api))


def load_args(api: Api, arch: Arch, ctx, base, offset: int) -> Items:
    """Copy every argument cell to base+offset+8*cell; registers by load, stack slots by
    one probe_read_user per run of consecutive slots; unused cells are zeroed. A row whose
    arguments are all in registers gets every argument register (the cells past its own
    arguments hold whatever the registers held: the decoder never reads them)."""
    if in_registers(api, arch):
        return _load_registers(arch, ctx, base, offset)
    sources = _sources(api, arch)
    prog: Items = []
    for slot, cell in sources.registers:
        prog += [asm.ldx(DW, R1, ctx, arch.arg(slot)),
                 asm.stx(DW, base, offset + 8 * cell, R1)]
    for cell in range(sources.used, record.ARG_CELLS):
        prog.append(asm.st(DW, base, offset + 8 * cell, 0))
    return prog + _read_user_memory(sources, arch, ctx, base, offset)


def _load_registers(arch: Arch, ctx, base, offset: int) -> Items:
    """Every argument register into its cell; the cells past them zeroed."""
    prog: Items = []
    for slot in range(record.ARG_CELLS):
        if slot < len(arch.args):
            prog += [asm.ldx(DW, R1, ctx, arch.arg(slot)),
                     asm.stx(DW, base, offset + 8 * slot, R1)]
        else:
            prog.append(asm.st(DW, base, offset + 8 * slot, 0))
    return prog


class _Sources(NamedTuple):
    """Where a row's argument cells come from at entry."""

    registers: List[Tuple[int, int]]  # (register slot, cell), in the row's order
    stack_runs: List[Tuple[int, int, int]]  # (first stack slot, first cell, count)
    derefs: List[Tuple[int, int, int, int]]  # (register slot, first cell, bytes, at)
    callers: List[int]  # cells of the caller's return address
    used: int  # cells the row's arguments fill (the rest are zeroed)


def _sources(api: Api, arch: Arch) -> _Sources:
    """The row's argument cells by source: consecutive stack slots into consecutive cells
    make one run (one read)."""
    sources = _Sources([], [], [], [], 0)
    stack_runs = sources.stack_runs
    used = 0
    for arg, first in arg_cells(api):
        if arg.kind == Kind.CALLER:
            sources.callers.append(first)
            used = max(used, first + 1)
            continue
        if arg.deref:
            sources.derefs.append((arg.slot, first, arg.deref, arg.deref_at))
            used = max(used, first + arg.cells)
            continue
        for c in range(arg.cells):
            slot, cell = arg.slot + c, first + c
            used = max(used, cell + 1)
            if slot < len(arch.args):
                sources.registers.append((slot, cell))
            elif stack_runs and stack_runs[-1][0] + stack_runs[-1][2] == slot - len(arch.args) \
                    and stack_runs[-1][1] + stack_runs[-1][2] == cell:
                k, first_cell, n = stack_runs[-1]
                stack_runs[-1] = (k, first_cell, n + 1)
            else:
                stack_runs.append((slot - len(arch.args), cell, 1))
    return sources._replace(used=used)


def _read_user_memory(sources: _Sources, arch: Arch, ctx, base, offset: int) -> Items:
    """probe_read_user of the stack runs, the caller's return address and the structs
    behind pointers, into their cells."""
    prog: Items = []
    for k, cell, n in sources.stack_runs:
        prog += [
            asm.mov(R1, base), asm.add(R1, offset + 8 * cell), asm.mov(R2, 8 * n),
            asm.ldx(DW, R3, ctx, arch.sp), asm.add(R3, arch.stack_arg(k)),
            asm.call(Helper.PROBE_READ_USER),
        ]
    for cell in sources.callers:
        if arch.link_register is not None:  # arm64: at entry the return address is in lr
            prog += [asm.ldx(DW, R1, ctx, arch.link_register),
                     asm.stx(DW, base, offset + 8 * cell, R1)]
            continue
        prog += [  # x86-64: at entry the stack pointer points at the return address
            asm.mov(R1, base), asm.add(R1, offset + 8 * cell), asm.mov(R2, 8),
            asm.ldx(DW, R3, ctx, arch.sp),
            asm.call(Helper.PROBE_READ_USER),
        ]
    for slot, cell, size, at in sources.derefs:
        # A struct behind a pointer argument (e.g. a launch configuration); a bad pointer
        # leaves the cells zeroed by the helper.
        prog += [
            asm.mov(R1, base), asm.add(R1, offset + 8 * cell), asm.mov(R2, size),
            asm.ldx(DW, R3, ctx, arch.arg(slot)),
        ] + ([asm.add(R3, at)] if at else []) + [
            asm.call(Helper.PROBE_READ_USER),
        ]
    return prog


def read_outs(api: Api, arch: Arch, flags: int = 0) -> Items:
    """Out-parameters, read only when the call returned success (0); faults flagged (on top
    of `flags`)."""
    prog: Items = [asm.mov(R9, flags)]
    prog += [asm.st(DW, R8, record.OUTS + 8 * j, 0) for j in range(record.OUT_CELLS)]
    if api.outs:
        prog += layout.ret_into(R1, api.returns_value, arch.ret) + [
            asm.jne32(R1, 0, "outs_done")]
        for j, out in enumerate(api.outs):
            prog += [
                asm.mov(R1, R8), asm.add(R1, record.OUTS + 8 * j), asm.mov(R2, out.size),
                asm.ldx(DW, R3, R7, record.INFLIGHT_OUTPTRS + 8 * j),
                asm.call(Helper.PROBE_READ_USER),
                asm.jeq(R0, 0, "out%d_ok" % j),
                asm.or_(R9, record.FLAG_OUT0_FAULT << j),
                asm.Label("out%d_ok" % j),
            ]
        prog.append(asm.Label("outs_done"))
    return prog + [asm.stx(B, R8, record.FLAGS, R9)]


def field_offset(api: Api, name: str) -> int:
    """Offset in the record of the argument or out-parameter called `name`."""
    for j, out in enumerate(api.outs):
        if out.name == name:
            return record.OUTS + 8 * j
    for arg, cell in arg_cells(api):
        if arg.name == name:
            return record.ARGS + 8 * cell
    raise ValueError("%s has no field %r" % (api.name, name))


def learn_name(api: Api, arch: Arch) -> Items:
    """On success, the string the name field points to goes to the `names` map in chunks of
    NAME_CHUNK characters: names[(pid | k << 32, handle, exit time)] = chunk k,
    NUL-terminated, for k = 0, 1, ... until the string ends (at most NAME_CHUNKS chunks):
    names of any length are kept whole, read while the call's memory is still there. The
    call's time in the key keeps each call's name apart: a handle made again (a program
    exec'd in the same process, laid out the same way) does not overwrite the name of the
    one before, which the reader may not have read yet (execs.py). A chunk the probe cannot
    read (a page of the string not mapped in yet: a library's .rodata that nothing has
    read) flags the record FLAG_NAME_UNREAD: the reader reads the name from the file."""
    assert api.learn_name is not None
    handle, string = (field_offset(api, f) for f in api.learn_name)
    prog = layout.ret_into(R1, api.returns_value, arch.ret) + [
        asm.jne32(R1, 0, "name_done"),
        asm.st(W, FP, layout.STAT_KEY_AT, 0),
        asm.ld_map(R1, layout.SCRATCH), asm.mov(R2, FP), asm.add(R2, layout.STAT_KEY_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.jeq(R0, 0, "name_done"),
        asm.mov(R9, R0),
        asm.ldx(DW, R1, R8, handle), asm.stx(DW, R9, 8, R1),
        asm.ldx(DW, R1, R8, record.TS_EXIT), asm.stx(DW, R9, 16, R1),
    ]
    for k in range(layout.NAME_CHUNKS):
        prog += [
            asm.ldx(DW, R1, R8, record.PID_TGID), asm.rsh(R1, 32),
        ] + ([asm.mov(R2, k), asm.lsh(R2, 32), asm.or_(R1, R2)] if k else []) + [
            asm.stx(DW, R9, 0, R1),
            asm.mov(R1, R9), asm.add(R1, layout.NAME_KEY_SIZE), asm.mov(R2, layout.NAME_SIZE),
            asm.ldx(DW, R3, R8, string),
        ] + ([asm.add(R3, k * layout.NAME_CHUNK)] if k else []) + [
            asm.call(Helper.PROBE_READ_USER_STR),
            asm.jsle(R0, 0, "name_unread"),
            asm.stx(DW, FP, layout.NAME_LEN_AT, R0),
            asm.ld_map(R1, layout.NAMES), asm.mov(R2, R9), asm.mov(R3, R9),
            asm.add(R3, layout.NAME_KEY_SIZE), asm.mov(R4, 0),
            asm.call(Helper.MAP_UPDATE_ELEM),
            asm.ldx(DW, R1, FP, layout.NAME_LEN_AT),
            asm.jlt(R1, layout.NAME_SIZE, "name_done"),  # the string ended in this chunk
        ]
    return prog + [asm.ja("name_done"), asm.Label("name_unread"),
                   asm.ldx(B, R1, R8, record.FLAGS), asm.or_(R1, record.FLAG_NAME_UNREAD),
                   asm.stx(B, R8, record.FLAGS, R1), asm.Label("name_done")]
