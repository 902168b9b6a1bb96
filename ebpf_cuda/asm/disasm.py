"""Decode the kernel's bytes back into instructions and print them readably.

The listing uses the kernel verifier's notation (`r1 = *(u64 *)(r6 +112)`), so it reads
side by side with a verifier log.
"""
import struct
from typing import List, Union

from .helpers import Helper
from .instructions import Instruction
from .opcodes import FETCH, AluOp, Atomic, Class, JumpOp, Mode, Size, Source

_SLOT = struct.Struct("<BBhi")
_WIDE = Class.LD | Mode.IMM | Size.DW
_ALU_SYMBOL = {AluOp.ADD: "+=", AluOp.SUB: "-=", AluOp.MUL: "*=", AluOp.DIV: "/=",
               AluOp.OR: "|=", AluOp.AND: "&=", AluOp.LSH: "<<=", AluOp.RSH: ">>=",
               AluOp.MOD: "%=", AluOp.XOR: "^=", AluOp.MOV: "=", AluOp.ARSH: "s>>="}
_JUMP_SYMBOL = {JumpOp.JEQ: "==", JumpOp.JGT: ">", JumpOp.JGE: ">=", JumpOp.JSET: "&",
                JumpOp.JNE: "!=", JumpOp.JSGT: "s>", JumpOp.JSGE: "s>=", JumpOp.JLT: "<",
                JumpOp.JLE: "<=", JumpOp.JSLT: "s<", JumpOp.JSLE: "s<="}
_SIZE_TYPE = {Size.B: "u8", Size.H: "u16", Size.W: "u32", Size.DW: "u64"}


def decode(code: bytes) -> List[Instruction]:
    """Split bytes into instructions (ld_imm64 becomes one 64-bit value)."""
    if len(code) % 8:
        raise ValueError("program length %d is not a multiple of 8" % len(code))
    slots = list(_SLOT.iter_unpack(code))
    out, i = [], 0
    while i < len(slots):
        opcode, regs, off, imm = slots[i]
        if opcode == _WIDE:
            if i + 1 >= len(slots):
                raise ValueError("ld_imm64 at slot %d has no second slot" % i)
            imm = (imm & 0xFFFFFFFF) | ((slots[i + 1][3] & 0xFFFFFFFF) << 32)
        out.append(Instruction(opcode, regs & 0x0F, regs >> 4, off, imm))
        i += 2 if opcode == _WIDE else 1
    return out


def format_instruction(insn: Instruction) -> str:
    """One instruction in verifier notation."""
    cls = Class(insn.opcode & 0x07)
    if cls in (Class.ALU, Class.ALU64):
        return _format_alu(insn, cls)
    if cls in (Class.JMP, Class.JMP32):
        return _format_jump(insn, cls)
    return _format_memory(insn, cls)


def _operand(insn: Instruction, wide: bool) -> str:
    if insn.opcode & Source.X:
        return "%s%d" % ("r" if wide else "w", insn.src)
    return str(insn.imm)


def _format_alu(insn: Instruction, cls: Class) -> str:
    op = AluOp(insn.opcode & 0xF0)
    reg = "r" if cls == Class.ALU64 else "w"
    if op == AluOp.NEG:
        return "%s%d = -%s%d" % (reg, insn.dst, reg, insn.dst)
    if op == AluOp.END:
        order = "be" if insn.opcode & Source.X else "le"
        return "r%d = %s%d r%d" % (insn.dst, order, insn.imm, insn.dst)
    return "%s%d %s %s" % (reg, insn.dst, _ALU_SYMBOL[op], _operand(insn, cls == Class.ALU64))


def _format_jump(insn: Instruction, cls: Class) -> str:
    op = JumpOp(insn.opcode & 0xF0)
    if op == JumpOp.CALL:
        if insn.src == 2:  # (BPF_PSEUDO_KFUNC_CALL: a kernel function by BTF id)
            return "call kfunc#%d" % insn.imm
        try:
            return "call %s#%d" % (Helper(insn.imm).name.lower(), insn.imm)
        except ValueError:
            return "call #%d" % insn.imm
    if op == JumpOp.EXIT:
        return "exit"
    if op == JumpOp.JA:
        return "goto %+d" % insn.off
    reg = "r" if cls == Class.JMP else "w"
    return "if %s%d %s %s goto %+d" % (reg, insn.dst, _JUMP_SYMBOL[op],
                                       _operand(insn, cls == Class.JMP), insn.off)


def _format_memory(insn: Instruction, cls: Class) -> str:
    size = Size(insn.opcode & 0x18)
    mode = insn.opcode & 0xE0
    ctype = _SIZE_TYPE[size]
    if insn.opcode == _WIDE:
        if insn.src == 1:
            return "r%d = map[fd %d]" % (insn.dst, insn.imm & 0xFFFFFFFF)
        if insn.src == 2:
            return "r%d = map_value[fd %d] + %d" % (insn.dst, insn.imm & 0xFFFFFFFF,
                                                     insn.imm >> 32)
        return "r%d = %#x ll" % (insn.dst, insn.imm)
    if cls == Class.LDX:
        sign = "s" if mode == Mode.MEMSX else "u"
        return "r%d = *(%s%s *)(r%d %+d)" % (insn.dst, sign, ctype[1:], insn.src, insn.off)
    if cls == Class.ST:
        return "*(%s *)(r%d %+d) = %d" % (ctype, insn.dst, insn.off, insn.imm)
    if cls == Class.STX and mode == Mode.ATOMIC:
        return _format_atomic(insn, ctype)
    if cls == Class.STX:
        return "*(%s *)(r%d %+d) = r%d" % (ctype, insn.dst, insn.off, insn.src)
    return "unknown opcode %#04x" % insn.opcode


def _format_atomic(insn: Instruction, ctype: str) -> str:
    target = "*(%s *)(r%d %+d)" % (ctype, insn.dst, insn.off)
    if insn.imm == Atomic.XCHG:
        return "r%d = atomic_xchg(%s, r%d)" % (insn.src, target, insn.src)
    if insn.imm == Atomic.CMPXCHG:
        return "r0 = atomic_cmpxchg(%s, r0, r%d)" % (target, insn.src)
    try:
        name = Atomic(insn.imm & ~FETCH).name.lower()
    except ValueError:
        return "atomic op %#x on %s" % (insn.imm, target)
    if insn.imm & FETCH:
        return "r%d = atomic_fetch_%s(%s, r%d)" % (insn.src, name, target, insn.src)
    return "lock %s %s= r%d" % (target, {"add": "+", "or": "|", "and": "&", "xor": "^"}[name],
                                insn.src)


def disassemble(code: Union[bytes, List[Instruction]]) -> str:
    """A numbered listing, one instruction per line, slots counted as the verifier does."""
    insns = decode(code) if isinstance(code, (bytes, bytearray)) else code
    lines, slot = [], 0
    for insn in insns:
        lines.append("%4d: %s" % (slot, format_instruction(insn)))
        slot += insn.slots
    return "\n".join(lines)
