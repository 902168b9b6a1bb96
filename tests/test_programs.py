"""Loading programs: from asm instructions with maps, from raw bytes, verifier rejections."""
import gc

import pytest

from ebpf_cuda import asm
from ebpf_cuda.bpf import maps
from ebpf_cuda.asm import DW, R0, R1, R2, R10, W, Helper
from ebpf_cuda.errors import VerifierError
from ebpf_cuda.bpf.programs import EXPECTED_UPROBE_MULTI, Program
from kernel_fds import open_fds


def kernel_release() -> tuple:
    import os
    return tuple(int(n) for n in os.uname().release.split("-")[0].split(".")[:2])


def counter(null_check: bool = True):
    """counts[0] += 1 (atomically); without the NULL check the verifier must refuse it."""
    body = [
        asm.st(W, R10, -4, 0),
        asm.mov(R2, R10),
        asm.add(R2, -4),
        asm.ld_map(R1, "counts"),
        asm.call(Helper.MAP_LOOKUP_ELEM),
    ]
    if null_check:
        body.append(asm.jeq(R0, 0, "out"))
    return body + [
        asm.mov(R1, 1),
        asm.atomic_add(DW, R0, 0, R1),
        asm.Label("out"),
        asm.mov(R0, 0),
        asm.exit(),
    ]


@pytest.mark.kernel
def test_load_with_maps_and_disassembly(root):
    with maps.ArrayMap(8, 1, name="counts") as counts:
        prog = Program(counter(), maps={"counts": counts}, name="count")
        with prog.load():
            assert prog.loaded and prog.fd >= 0
            info = prog.info()
            assert info.name == "count"
            # (verified_insns came with 5.16: older kernels leave it 0)
            assert info.verified_insns > 0 or kernel_release() < (5, 16)
            listing = prog.disassembly()
            assert "call" in listing and "exit" in listing
            assert prog.log == ""  # no log asked for, none kept
        assert not prog.loaded


@pytest.mark.kernel
def test_map_may_be_given_as_fd(root):
    with maps.ArrayMap(8, 1) as counts:
        with Program(counter(), maps={"counts": counts.fd}, name="count_fd").load(log_level=1) as p:
            assert "processed" in p.log


@pytest.mark.kernel
def test_from_bytes_independent_of_asm(root):
    code = bytes([0xB7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])
    with Program.from_bytes(code, name="raw", expected_attach_type=EXPECTED_UPROBE_MULTI) as p:
        p.load()
        assert p.info().name == "raw"
        assert "exit" in p.disassembly()


@pytest.mark.kernel
def test_missing_null_check_is_rejected_with_log(root):
    # A hash map: on 6.18 an array lookup with a constant in-range key is known non-NULL.
    with maps.HashMap(4, 8, 1) as counts:
        prog = Program(counter(null_check=False), maps={"counts": counts}, name="nocheck")
        with pytest.raises(VerifierError) as info:
            prog.load()
    err = info.value
    assert "invalid mem access 'map_value_or_null'" in err.log
    assert "map_value_or_null" in str(err)
    assert prog.log == err.log and not prog.loaded
    assert any("map_value_or_null" in line for line in prog.relevant_log_lines())


@pytest.mark.kernel
def test_gpl_only_helper_needs_gpl_license(root):
    body = [
        asm.mov(R1, R10), asm.add(R1, -8), asm.mov(R2, 8), asm.mov(asm.R3, 0),
        asm.call(Helper.PROBE_READ_USER),
        asm.mov(R0, 0), asm.exit(),
    ]
    with Program(body, name="gpl", license="GPL").load():
        pass
    with pytest.raises(VerifierError) as info:
        Program(body, name="mit", license="MIT").load()
    assert "GPL" in info.value.log


@pytest.mark.kernel
def test_double_load_and_unloaded_fd(root):
    prog = Program([asm.mov(R0, 0), asm.exit()], name="twice")
    with pytest.raises(ValueError, match="not loaded"):
        prog.fd
    prog.load()
    with pytest.raises(ValueError, match="already loaded"):
        prog.load()
    prog.close()


def test_bad_program_name():
    with pytest.raises(ValueError):
        Program([asm.exit()], name="has-dash")


@pytest.mark.kernel
def test_programs_close_their_fds(root):
    before = open_fds()
    prog = Program([asm.mov(R0, 0), asm.exit()], name="fds").load()
    assert str(prog.fd) in open_fds()
    prog.close()
    assert open_fds() == before
    Program([asm.mov(R0, 0), asm.exit()], name="gc").load()
    gc.collect()
    assert open_fds() == before


@pytest.mark.kernel
def test_a_program_is_found_by_id_with_its_name(root):
    """syscalls.prog_ids / prog_fd_by_id (how a benchmark reads the run statistics of
    programs another process loaded)."""
    from ebpf_cuda import syscalls

    with Program([asm.mov(R0, 0), asm.exit()], name="by_id_probe").load() as prog:
        own = syscalls.prog_info(prog.fd).id
        ids = list(syscalls.prog_ids())
        assert own in ids and ids == sorted(ids)
        fd = syscalls.prog_fd_by_id(own)
        try:
            assert syscalls.prog_info(fd.value).name == "by_id_probe"
        finally:
            fd.close()
    assert own not in syscalls.prog_ids()
