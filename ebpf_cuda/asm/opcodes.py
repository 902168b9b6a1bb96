"""Opcode fields of the eBPF instruction set (UAPI bpf_common.h / bpf.h).

An opcode byte is class | operation | source (ALU/JMP) or class | mode | size (memory).
"""
import enum


class Class(enum.IntEnum):
    LD = 0x00
    LDX = 0x01
    ST = 0x02
    STX = 0x03
    ALU = 0x04
    JMP = 0x05
    JMP32 = 0x06
    ALU64 = 0x07


class Source(enum.IntEnum):
    K = 0x00  # immediate operand
    X = 0x08  # register operand


class AluOp(enum.IntEnum):
    ADD = 0x00
    SUB = 0x10
    MUL = 0x20
    DIV = 0x30
    OR = 0x40
    AND = 0x50
    LSH = 0x60
    RSH = 0x70
    NEG = 0x80
    MOD = 0x90
    XOR = 0xA0
    MOV = 0xB0
    ARSH = 0xC0
    END = 0xD0


class JumpOp(enum.IntEnum):
    JA = 0x00
    JEQ = 0x10
    JGT = 0x20
    JGE = 0x30
    JSET = 0x40
    JNE = 0x50
    JSGT = 0x60
    JSGE = 0x70
    CALL = 0x80
    EXIT = 0x90
    JLT = 0xA0
    JLE = 0xB0
    JSLT = 0xC0
    JSLE = 0xD0


class Mode(enum.IntEnum):
    IMM = 0x00
    MEM = 0x60
    MEMSX = 0x80
    ATOMIC = 0xC0


class Size(enum.IntEnum):
    """Access width of a load or store; the value is the opcode's size field."""

    W = 0x00
    H = 0x08
    B = 0x10
    DW = 0x18

    @property
    def bytes(self) -> int:
        return {Size.W: 4, Size.H: 2, Size.B: 1, Size.DW: 8}[self]


class Atomic(enum.IntEnum):
    """Atomic operation, carried in the immediate of STX|ATOMIC."""

    ADD = 0x00
    OR = 0x40
    AND = 0x50
    XOR = 0xA0
    XCHG = 0xE0 | 0x01
    CMPXCHG = 0xF0 | 0x01


FETCH = 0x01  # BPF_FETCH: also return the old value

PSEUDO_MAP_FD = 1  # ld_imm64 src_reg: imm is a map fd
PSEUDO_MAP_VALUE = 2  # ld_imm64 src_reg: imm is a map fd, second imm a value offset
PSEUDO_CALL = 1  # call src_reg: BPF-to-BPF call
PSEUDO_KFUNC_CALL = 2  # call src_reg: imm is a kernel function's BTF id (vmlinux's)
