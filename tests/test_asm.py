"""Assembler and disassembler tests. Expected bytes come from the kernel's own instruction
macros (include/linux/filter.h, e.g. BPF_MOV64_REG, BPF_LD_MAP_FD, BPF_EXIT_INSN) and from
byte fixtures in cilium/ebpf's asm tests, written out by hand, not produced by our encoder."""
import pytest

from ebpf_cuda import asm
from ebpf_cuda.asm import DW, FP, B, H, R0, R1, R2, R3, R6, R10, W, Atomic, Helper

KNOWN = [
    # (instruction, bytes as the kernel macros lay them out)
    (asm.mov(R6, R1), "bf16000000000000"),              # BPF_MOV64_REG(R6, R1)
    (asm.mov(R2, 64), "b702000040000000"),              # BPF_MOV64_IMM(R2, 64)
    (asm.mov32(R0, 0), "b400000000000000"),             # BPF_MOV32_IMM(R0, 0)
    (asm.mov(R1, -8), "b7010000f8ffffff"),              # BPF_MOV64_IMM(R1, -8)
    (asm.add(R1, -8), "07010000f8ffffff"),              # BPF_ALU64_IMM(BPF_ADD, R1, -8)
    (asm.add(R1, R10), "0fa1000000000000"),             # BPF_ALU64_REG(BPF_ADD, R1, R10)
    (asm.sub32(R3, R2), "1c23000000000000"),            # BPF_ALU32_REG(BPF_SUB, R3, R2)
    (asm.lsh(R1, 32), "6701000020000000"),              # BPF_ALU64_IMM(BPF_LSH, R1, 32)
    (asm.rsh(R1, 32), "7701000020000000"),
    (asm.arsh(R1, 3), "c701000003000000"),
    (asm.and_(R1, 0xff), "57010000ff000000"),
    (asm.or_(R1, R2), "4f21000000000000"),
    (asm.xor32(R1, 1), "a401000001000000"),
    (asm.mul(R1, 3), "2701000003000000"),
    (asm.div(R1, R2), "3f21000000000000"),
    (asm.mod32(R1, 7), "9401000007000000"),
    (asm.neg(R1), "8701000000000000"),                  # BPF_ALU64_IMM(BPF_NEG, R1, 0)
    (asm.end(R1, 16, big=True), "dc01000010000000"),    # BPF_ENDIAN(BPF_TO_BE, R1, 16)
    (asm.end(R1, 64), "d401000040000000"),              # BPF_ENDIAN(BPF_TO_LE, R1, 64)
    (asm.ldx(DW, R1, R6, 112), "7961700000000000"),     # BPF_LDX_MEM(BPF_DW, R1, R6, 112)
    (asm.ldx(W, R2, R6, 104), "6162680000000000"),
    (asm.ldx(H, R2, R6, 2), "6962020000000000"),
    (asm.ldx(B, R2, R6, 1), "7162010000000000"),
    (asm.ldxsx(W, R2, R6, 4), "8162040000000000"),      # BPF_LDX_MEMSX(BPF_W, ...)
    (asm.stx(DW, FP, -8, R0), "7b0af8ff00000000"),      # BPF_STX_MEM(BPF_DW, R10, R0, -8)
    (asm.stx(W, R0, 4, R1), "6310040000000000"),
    (asm.stx(H, R0, 2, R1), "6b10020000000000"),
    (asm.stx(B, R0, 1, R1), "7310010000000000"),
    (asm.st(DW, FP, -16, 0), "7a0af0ff00000000"),       # BPF_ST_MEM(BPF_DW, R10, -16, 0)
    (asm.st(W, R0, 8, 7), "6200080007000000"),
    (asm.atomic_add(DW, R1, 0, R2), "db21000000000000"),  # BPF_ATOMIC_OP(BPF_DW, BPF_ADD,..)
    (asm.atomic(Atomic.ADD, DW, R1, 0, R0, fetch=True), "db01000001000000"),  # cilium fixture
    (asm.atomic(Atomic.ADD, W, R1, 0, R2), "c321000000000000"),
    (asm.atomic(Atomic.OR, DW, R1, 8, R2, fetch=True), "db21080041000000"),
    (asm.atomic(Atomic.XCHG, DW, R1, 0, R2), "db210000e1000000"),
    (asm.atomic(Atomic.CMPXCHG, DW, R1, 0, R2), "db210000f1000000"),
    (asm.call(Helper.MAP_LOOKUP_ELEM), "8500000001000000"),  # BPF_EMIT_CALL(map_lookup_elem)
    (asm.call(Helper.RINGBUF_RESERVE), "8500000083000000"),
    (asm.exit(), "9500000000000000"),                   # BPF_EXIT_INSN()
    (asm.ld_imm64(R1, 0x1122334455667788),               # BPF_LD_IMM64(R1, ...)
     "1801000088776655000000004433221100"[:32]),
    (asm.ld_imm64(R2, -1), "18020000ffffffff00000000ffffffff"),
]


@pytest.mark.parametrize("insn,expected", KNOWN, ids=[e for _, e in KNOWN])
def test_encoding_matches_kernel_macros(insn, expected):
    assert asm.assemble([insn]).hex() == expected


def test_map_reference_is_patched_with_fd():
    code = asm.assemble([asm.ld_map(R1, "events")], maps={"events": 7})
    assert code.hex() == "1811000007000000" "0000000000000000"  # BPF_LD_MAP_FD(R1, 7)
    assert asm.map_names([asm.ld_map(R1, "events"), asm.exit()]) == {"events"}


def test_map_value_reference_carries_offset():
    code = asm.assemble([asm.ld_map_value(R1, "counters", 16)], maps={"counters": 5})
    assert code.hex() == "1821000005000000" "0000000010000000"


def test_missing_map_fd_is_an_error():
    with pytest.raises(ValueError, match="no fd given for map 'events'"):
        asm.assemble([asm.ld_map(R1, "events")])


def test_jump_offsets_count_wide_loads_as_two_slots():
    program = [
        asm.jeq(R1, 0, "end"),          # slot 0
        asm.ld_imm64(R2, 1),            # slots 1-2
        asm.jne32(R1, R2, "end"),       # slot 3
        asm.ja("start"),                # slot 4, backwards
        asm.Label("end"),
        asm.Label("start"),             # two labels on one slot
        asm.mov(R0, 0),                 # slot 5
        asm.exit(),
    ]
    insns = asm.decode(asm.assemble(program))
    assert [i.off for i in insns] == [4, 0, 1, 0, 0, 0]
    assert insns[0].opcode == 0x15 and insns[2].opcode == 0x5e


def test_backward_jump():
    program = [asm.Label("top"), asm.add(R1, 1), asm.jlt(R1, 10, "top"), asm.exit()]
    assert asm.decode(asm.assemble(program))[1].off == -2


@pytest.mark.parametrize("program,message", [
    ([asm.ja("nowhere")], "undefined label 'nowhere'"),
    ([asm.Label("a"), asm.Label("a"), asm.exit()], "duplicate label 'a'"),
])
def test_label_errors(program, message):
    with pytest.raises(ValueError, match=message):
        asm.assemble(program)


def test_out_of_range_jump():
    program = [asm.ja("far")] + [asm.mov(R0, 0)] * 40000 + [asm.Label("far"), asm.exit()]
    with pytest.raises(ValueError, match="out of range"):
        asm.assemble(program)


@pytest.mark.parametrize("build", [
    lambda: asm.mov(11, 0), lambda: asm.mov(R1, -1 << 40), lambda: asm.ldx(DW, R1, R2, 1 << 16),
    lambda: asm.atomic(Atomic.ADD, B, R1, 0, R2), lambda: asm.end(R1, 8),
    lambda: asm.mov(-1, 0), lambda: asm.stx(DW, R1, 0, 12),
])
def test_bad_operands_are_value_errors(build):
    with pytest.raises(ValueError):
        build()


def test_disassembly_reads_like_the_verifier():
    program = [
        asm.mov(R6, R1), asm.ld_map(R1, "events"), asm.mov(R2, 64), asm.mov(R3, 0),
        asm.call(Helper.RINGBUF_RESERVE), asm.jeq(R0, 0, "out"), asm.ldx(DW, R1, R6, 112),
        asm.stx(DW, R0, 0, R1), asm.atomic_add(DW, R0, 8, R1), asm.Label("out"),
        asm.mov(R0, 0), asm.exit(),
    ]
    listing = asm.disassemble(asm.assemble(program, maps={"events": 3}))
    assert listing.splitlines() == [
        "   0: r6 = r1",
        "   1: r1 = map[fd 3]",
        "   3: r2 = 64",
        "   4: r3 = 0",
        "   5: call ringbuf_reserve#131",
        "   6: if r0 == 0 goto +3",
        "   7: r1 = *(u64 *)(r6 +112)",
        "   8: *(u64 *)(r0 +0) = r1",
        "   9: lock *(u64 *)(r0 +8) += r1",
        "  10: r0 = 0",
        "  11: exit",
    ]


def test_decode_round_trip():
    program = [insn for insn, _ in KNOWN]
    code = asm.assemble(program)
    assert asm.assemble(asm.decode(code)) == code


def test_a_kfunc_call_names_the_kernel_function_by_btf_id():
    insn = asm.kfunc_call(65575)
    assert asm.encode(insn) == bytes([0x85, 0x20, 0, 0]) + (65575).to_bytes(4, "little")
    assert asm.format_instruction(insn) == "call kfunc#65575"


def test_relabel_renames_labels_and_the_jumps_to_them():
    piece = [asm.jeq(R0, 0, "out"), asm.mov(R0, 1), asm.Label("out"), asm.exit()]
    program = piece + asm.relabel(piece, "r_")
    assert [i.name for i in program if isinstance(i, asm.Label)] == ["out", "r_out"]
    assert program[4].target == "r_out" and asm.resolve(program)[3].off == 1
