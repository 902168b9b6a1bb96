"""Instructions as plain values, and builders that read like assembly.

`asm.add(R1, 8)` is `r1 += 8`; an operand that is a `Reg` selects the register form, a plain
int the immediate form. Jumps name a label (`asm.jeq(R0, 0, "out")` ... `asm.Label("out")`);
`assemble()` turns labels into offsets and map names into fds.
"""
from typing import NamedTuple, Optional, Union

from .helpers import Helper
from .opcodes import (FETCH, PSEUDO_KFUNC_CALL, PSEUDO_MAP_FD, PSEUDO_MAP_VALUE, AluOp, Atomic,
                      Class, JumpOp, Mode, Size, Source)
from .registers import Reg, check_register

Operand = Union[Reg, int]


class Instruction(NamedTuple):
    """One eBPF instruction; `ld_imm64` is one value that occupies two slots."""

    opcode: int
    dst: int = 0
    src: int = 0
    off: int = 0
    imm: int = 0
    target: Optional[str] = None  # jump label, resolved by assemble()
    map_name: Optional[str] = None  # ld_imm64 map reference, patched with an fd by assemble()

    @property
    def is_wide(self) -> bool:
        return self.opcode == (Class.LD | Mode.IMM | Size.DW)

    @property
    def slots(self) -> int:
        return 2 if self.is_wide else 1


class Label(NamedTuple):
    """Marks the position of the next instruction; takes no slot."""

    name: str


def _imm32(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("immediate must be an int, got %r" % (value,))
    if not -(1 << 31) <= value < (1 << 32):
        raise ValueError("immediate %d does not fit in 32 bits" % value)
    return value - (1 << 32) if value >= (1 << 31) else value


def _off16(value: int) -> int:
    if not -(1 << 15) <= value < (1 << 15):
        raise ValueError("offset %d does not fit in 16 bits" % value)
    return value


def _alu(cls: Class, op: AluOp, dst: Reg, operand: Operand) -> Instruction:
    dst = check_register(dst)
    if isinstance(operand, Reg):
        return Instruction(cls | op | Source.X, dst, check_register(operand))
    return Instruction(cls | op | Source.K, dst, imm=_imm32(operand))


def _alu_builder(op: AluOp, cls: Class):
    def build(dst: Reg, operand: Operand) -> Instruction:
        return _alu(cls, op, dst, operand)

    suffix = "32" if cls == Class.ALU else ""
    build.__name__ = op.name.lower() + suffix
    build.__doc__ = "%s%s: dst %s= operand (register or 32-bit immediate)." % (
        op.name, suffix, op.name.lower())
    return build


add, sub, mul, div, or_, and_, lsh, rsh, mod, xor, mov, arsh = (
    _alu_builder(op, Class.ALU64) for op in (
        AluOp.ADD, AluOp.SUB, AluOp.MUL, AluOp.DIV, AluOp.OR, AluOp.AND, AluOp.LSH, AluOp.RSH,
        AluOp.MOD, AluOp.XOR, AluOp.MOV, AluOp.ARSH))
add32, sub32, mul32, div32, or32, and32, lsh32, rsh32, mod32, xor32, mov32, arsh32 = (
    _alu_builder(op, Class.ALU) for op in (
        AluOp.ADD, AluOp.SUB, AluOp.MUL, AluOp.DIV, AluOp.OR, AluOp.AND, AluOp.LSH, AluOp.RSH,
        AluOp.MOD, AluOp.XOR, AluOp.MOV, AluOp.ARSH))


def neg(dst: Reg) -> Instruction:
    """dst = -dst (64-bit)."""
    return Instruction(Class.ALU64 | AluOp.NEG, check_register(dst))


def neg32(dst: Reg) -> Instruction:
    """dst = -dst (32-bit)."""
    return Instruction(Class.ALU | AluOp.NEG, check_register(dst))


def end(dst: Reg, bits: int, big: bool = False) -> Instruction:
    """Convert dst (16, 32 or 64 bits) to little-endian or, with big=True, big-endian."""
    if bits not in (16, 32, 64):
        raise ValueError("byte swap width must be 16, 32 or 64, got %r" % (bits,))
    source = Source.X if big else Source.K
    return Instruction(Class.ALU | AluOp.END | source, check_register(dst), imm=bits)


def _jump(cls: Class, op: JumpOp, dst: Reg, operand: Operand, label: str) -> Instruction:
    dst = check_register(dst)
    if isinstance(operand, Reg):
        return Instruction(cls | op | Source.X, dst, check_register(operand), target=label)
    return Instruction(cls | op | Source.K, dst, imm=_imm32(operand), target=label)


def _jump_builder(op: JumpOp, cls: Class):
    def build(dst: Reg, operand: Operand, label: str) -> Instruction:
        return _jump(cls, op, dst, operand, label)

    suffix = "32" if cls == Class.JMP32 else ""
    build.__name__ = op.name.lower() + suffix
    build.__doc__ = "Jump to `label` if dst %s operand (%s-bit compare)." % (
        op.name, suffix or "64")
    return build


_CONDITIONS = (JumpOp.JEQ, JumpOp.JGT, JumpOp.JGE, JumpOp.JSET, JumpOp.JNE, JumpOp.JSGT,
               JumpOp.JSGE, JumpOp.JLT, JumpOp.JLE, JumpOp.JSLT, JumpOp.JSLE)
jeq, jgt, jge, jset, jne, jsgt, jsge, jlt, jle, jslt, jsle = (
    _jump_builder(op, Class.JMP) for op in _CONDITIONS)
jeq32, jgt32, jge32, jset32, jne32, jsgt32, jsge32, jlt32, jle32, jslt32, jsle32 = (
    _jump_builder(op, Class.JMP32) for op in _CONDITIONS)


def ja(label: str) -> Instruction:
    """Jump to `label` unconditionally."""
    return Instruction(Class.JMP | JumpOp.JA, target=label)


def call(helper: Union[Helper, int]) -> Instruction:
    """Call a helper function by id; result in R0, R1-R5 clobbered."""
    return Instruction(Class.JMP | JumpOp.CALL, imm=_imm32(int(helper)))


def kfunc_call(btf_id: int) -> Instruction:
    """Call the kernel function (kfunc) whose BTF type id in vmlinux is `btf_id`."""
    return Instruction(Class.JMP | JumpOp.CALL, src=PSEUDO_KFUNC_CALL, imm=_imm32(btf_id))


def exit() -> Instruction:  # noqa: A001 - the instruction is called exit
    """Return R0 to the kernel."""
    return Instruction(Class.JMP | JumpOp.EXIT)


def ldx(size: Size, dst: Reg, src: Reg, off: int) -> Instruction:
    """dst = *(size *)(src + off)."""
    return Instruction(Class.LDX | Mode.MEM | Size(size), check_register(dst),
                       check_register(src), _off16(off))


def ldxsx(size: Size, dst: Reg, src: Reg, off: int) -> Instruction:
    """dst = *(signed size *)(src + off), sign-extended (kernel 6.6)."""
    if Size(size) == Size.DW:
        raise ValueError("sign-extending loads exist for B, H and W only")
    return Instruction(Class.LDX | Mode.MEMSX | Size(size), check_register(dst),
                       check_register(src), _off16(off))


def st(size: Size, dst: Reg, off: int, imm: int) -> Instruction:
    """*(size *)(dst + off) = imm."""
    return Instruction(Class.ST | Mode.MEM | Size(size), check_register(dst), off=_off16(off),
                       imm=_imm32(imm))


def stx(size: Size, dst: Reg, off: int, src: Reg) -> Instruction:
    """*(size *)(dst + off) = src."""
    return Instruction(Class.STX | Mode.MEM | Size(size), check_register(dst),
                       check_register(src), _off16(off))


def atomic(op: Atomic, size: Size, dst: Reg, off: int, src: Reg,
           fetch: bool = False) -> Instruction:
    """Atomic read-modify-write of *(size *)(dst + off) with src (W or DW only)."""
    if Size(size) not in (Size.W, Size.DW):
        raise ValueError("atomics exist for W and DW only")
    imm = int(op) | (FETCH if fetch else 0)
    return Instruction(Class.STX | Mode.ATOMIC | Size(size), check_register(dst),
                       check_register(src), _off16(off), imm)


def atomic_add(size: Size, dst: Reg, off: int, src: Reg) -> Instruction:
    """*(size *)(dst + off) += src, atomically."""
    return atomic(Atomic.ADD, size, dst, off, src)


def ld_imm64(dst: Reg, value: int) -> Instruction:
    """dst = 64-bit constant (two slots)."""
    if not -(1 << 63) <= value < (1 << 64):
        raise ValueError("constant %d does not fit in 64 bits" % value)
    return Instruction(Class.LD | Mode.IMM | Size.DW, check_register(dst), imm=value & (2**64 - 1))


def ld_map(dst: Reg, name: str) -> Instruction:
    """dst = pointer to the map called `name` (BPF_PSEUDO_MAP_FD); fd patched at assembly."""
    return Instruction(Class.LD | Mode.IMM | Size.DW, check_register(dst), PSEUDO_MAP_FD,
                       map_name=name)


def ld_map_value(dst: Reg, name: str, offset: int = 0) -> Instruction:
    """dst = pointer into the value of array map `name` at `offset` (BPF_PSEUDO_MAP_VALUE)."""
    return Instruction(Class.LD | Mode.IMM | Size.DW, check_register(dst), PSEUDO_MAP_VALUE,
                       imm=offset << 32, map_name=name)
