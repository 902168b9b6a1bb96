"""An eBPF assembler: instructions as values, symbolic labels and maps, and a disassembler.

See docs/design.md for a worked example. Knows nothing of CUDA, files or the kernel.
"""
from .assemble import assemble, encode, map_names, relabel, resolve
from .disasm import decode, disassemble, format_instruction
from .helpers import ANY, EXIST, NOEXIST, RB_FORCE_WAKEUP, RB_NO_WAKEUP, Helper
from .instructions import (Instruction, Label, add, add32, and32, and_, arsh, arsh32, atomic,
                           atomic_add, call, div, div32, end, exit, ja, jeq, jeq32, jge, jge32, jgt,
                           jgt32, jle, jle32, jlt, jlt32, jne, jne32, jset, jset32, jsge, jsge32,
                           jsgt, jsgt32, jsle, jsle32, jslt, jslt32, kfunc_call, ld_imm64, ld_map,
                           ld_map_value, ldx, ldxsx, lsh, lsh32, mod, mod32, mov, mov32, mul, mul32,
                           neg, neg32, or32, or_, rsh, rsh32, st, stx, sub, sub32, xor, xor32)
from .opcodes import Atomic, Class, Size
from .registers import FP, R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10, Reg

B, H, W, DW = Size.B, Size.H, Size.W, Size.DW
