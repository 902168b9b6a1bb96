"""The eleven eBPF registers."""
import enum


class Reg(enum.IntEnum):
    R0 = 0  # return value of helpers and of the program
    R1 = 1  # R1-R5: helper arguments, clobbered by calls
    R2 = 2
    R3 = 3
    R4 = 4
    R5 = 5
    R6 = 6  # R6-R9: callee-saved, survive helper calls
    R7 = 7
    R8 = 8
    R9 = 9
    R10 = 10  # read-only frame pointer


R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 = tuple(Reg)
FP = R10


def check_register(value: object) -> int:
    """Return `value` as a register number, or raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10:
        raise ValueError("bad register %r: eBPF has registers r0 to r10" % (value,))
    return int(value)
