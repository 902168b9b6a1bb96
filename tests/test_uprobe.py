"""Real uprobes on a small gcc-built library: counts, registers, pointers, returns, pids,
uprobe_multi with cookies, link info, detaching, and the error paths."""
import os
import struct
import subprocess

import pytest
from elftools.elf.elffile import ELFFile

from ebpf_cuda import arch, asm, syscalls
from ebpf_cuda.bpf import maps, uprobe
from ebpf_cuda.asm import DW, R0, R1, R2, R3, R4, R6, R10, W, Helper
from ebpf_cuda.errors import AttachError, UnsupportedKernelError
from ebpf_cuda.bpf.programs import EXPECTED_UPROBE_MULTI, Program
from kernel_fds import open_fds, perf_links, require_perf_links

U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
ARCH = arch.current()

pytestmark = pytest.mark.kernel  # (registers from arch.current(): x86-64 and arm64)


# -- the target -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target(cc):
    """(library path, caller executable path); -O0 so every function starts with push %rbp."""
    lib = cc.shared("probe_target.c", "libprobe_target.so", extra=("-O0",))
    exe = cc.executable("probe_caller.c", "probe_caller",
                        extra=("-L", str(lib.parent), "-lprobe_target",
                               "-Wl,-rpath," + str(lib.parent)))
    return str(lib), str(exe)


def file_offset(path: str, symbol: str) -> int:
    """st_value translated through the PT_LOAD segment that holds it."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        sym = elf.get_section_by_name(".symtab").get_symbol_by_name(symbol)[0]
        addr = sym["st_value"]
        for seg in elf.iter_segments():
            start = seg["p_vaddr"]
            if seg["p_type"] == "PT_LOAD" and start <= addr < start + seg["p_memsz"]:
                return addr - start + seg["p_offset"]
    raise LookupError(symbol)


def run_caller(exe: str, n: int) -> str:
    return subprocess.run([exe, str(n)], check=True, capture_output=True, text=True).stdout


class Waiting:
    """A caller started with `wait`: attach probes after it is running, then release it."""

    def __init__(self, exe: str, n: int) -> None:
        self.proc = subprocess.Popen([exe, str(n), "wait"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split()
        assert line[0] == "ready"
        self.pid = int(line[1])

    def release(self) -> str:
        out, _ = self.proc.communicate("go\n", timeout=30)
        assert self.proc.returncode == 0
        return out


# -- programs ---------------------------------------------------------------------------


def lookup_counter_slot(key_setup):
    """r0 = &counts[key] or jump to out; `key_setup` leaves the u32 key at fp-4."""
    return key_setup + [
        asm.mov(R2, R10), asm.add(R2, -4),
        asm.ld_map(R1, "counts"),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.jeq(R0, 0, "out"),
        asm.mov(R1, 1),
        asm.atomic_add(DW, R0, 0, R1),
        asm.Label("out"),
        asm.mov(R0, 0),
        asm.exit(),
    ]


def counting_program(counts, by_cookie=False, expected_attach_type=0) -> Program:
    """counts[0] += 1, or counts[cookie] += 1."""
    if by_cookie:
        key = [asm.call(Helper.GET_ATTACH_COOKIE), asm.stx(W, R10, -4, R0)]  # r1 is ctx
    else:
        key = [asm.st(W, R10, -4, 0)]
    return Program(lookup_counter_slot(key), maps={"counts": counts}, name="count",
                   expected_attach_type=expected_attach_type).load()


def store_record(slots):
    """Zero a 64-byte record at fp-72, run `slots` to fill it, store it at out[0]."""
    zero = [asm.st(DW, R10, -72 + 8 * i, 0) for i in range(8)]
    return [asm.mov(R6, R1)] + zero + slots + [
        asm.st(W, R10, -4, 0),
        asm.ld_map(R1, "out"),
        asm.mov(R2, R10), asm.add(R2, -4),
        asm.mov(R3, R10), asm.add(R3, -72),
        asm.mov(R4, 0),
        asm.call(Helper.MAP_UPDATE_ELEM),
        asm.mov(R0, 0),
        asm.exit(),
    ]


def copy_reg(ctx_off: int, rec_off: int):
    return [asm.ldx(DW, R1, R6, ctx_off), asm.stx(DW, R10, -72 + rec_off, R1)]


def read_user(rec_off: int, size: int, base_ctx_off: int, add: int = 0):
    """probe_read_user(record + rec_off, size, ctx[base_ctx_off] + add)."""
    return [
        asm.mov(R1, R10), asm.add(R1, -72 + rec_off),
        asm.mov(R2, size),
        asm.ldx(DW, R3, R6, base_ctx_off),
        asm.add(R3, add),
        asm.call(Helper.PROBE_READ_USER),
    ]


def record_map():
    return maps.HashMap(4, 64, 4, name="out", key_struct=U32)


# -- tests ------------------------------------------------------------------------------


def test_entry_probe_counts_exactly_n_calls(root, target):
    lib, exe = target
    with maps.ArrayMap(8, 1, value_struct=U64) as counts, counting_program(counts) as prog:
        with uprobe.attach_uprobe(prog, lib, file_offset(lib, "pt_tick"), what="pt_tick"):
            run_caller(exe, 17)
            run_caller(exe, 3)
        assert counts[0] == 20
        run_caller(exe, 5)  # detached: not counted
        assert counts[0] == 20


def test_registers_and_pointer_arguments(root, target):
    lib, exe = target
    body = store_record(
        copy_reg(ARCH.arg(0), 0)  # int a = 7
        + copy_reg(ARCH.arg(1), 8)  # long b = -5
        + read_user(16, 16, ARCH.arg(2))  # "hello uprobe"
        + read_user(32, 4, ARCH.arg(3))  # *p = 1234
        + copy_reg(ARCH.arg(4), 40)  # e = 99
        + copy_reg(ARCH.arg(5), 48)  # f = -1
    )
    with record_map() as out, Program(body, maps={"out": out}, name="args").load() as prog:
        with uprobe.attach_uprobe(prog, lib, file_offset(lib, "pt_args")):
            run_caller(exe, 0)
        rec = out[0]
    a, b = struct.unpack_from("<iq", rec, 0)[0], struct.unpack_from("<q", rec, 8)[0]
    assert (a, b) == (7, -5)
    assert rec[16:32].split(b"\0")[0] == b"hello uprobe"
    assert struct.unpack_from("<i", rec, 32)[0] == 1234
    assert struct.unpack_from("<Qq", rec, 40) == (99, -1)


def test_stack_arguments_at_entry(root, target):
    lib, exe = target
    if len(ARCH.args) >= 8:  # arm64: all eight in x0..x7, none on the stack
        body = store_record(copy_reg(ARCH.arg(5), 0) + copy_reg(ARCH.arg(6), 8)
                            + copy_reg(ARCH.arg(7), 16))
    else:
        body = store_record(
            copy_reg(ARCH.arg(5), 0)  # a6 = 6 in r9
            + read_user(8, 16, ARCH.sp, ARCH.stack_arg(0))  # a7, a8 at sp+8, sp+16
        )
    with record_map() as out, Program(body, maps={"out": out}, name="stack").load() as prog:
        with uprobe.attach_uprobe(prog, lib, file_offset(lib, "pt_many")):
            run_caller(exe, 0)
        assert struct.unpack_from("<qqq", out[0], 0) == (6, 7, 8)


def test_return_probe_records_return_value(root, target):
    lib, exe = target
    body = store_record(copy_reg(ARCH.ret, 0) + copy_reg(ARCH.sp, 8))
    with record_map() as out, Program(body, maps={"out": out}, name="ret").load() as prog:
        with uprobe.attach_uprobe(prog, lib, file_offset(lib, "pt_add"), retprobe=True) as link:
            assert link.retprobe
            if link.has_bpf_link:  # (before 5.15: joined by ioctl, no link to query)
                info = link.info()
                assert info.retprobe or not info.details  # (6.1's perf links: no details)
            assert "add 42" in run_caller(exe, 0)
        assert struct.unpack_from("<i", out[0], 0)[0] == 42


def test_pid_filter_ignores_other_processes(root, target):
    lib, exe = target
    with maps.ArrayMap(8, 1, value_struct=U64) as counts, counting_program(counts) as prog:
        mine, other = Waiting(exe, 5), Waiting(exe, 7)
        try:
            with uprobe.attach_uprobe(prog, lib, file_offset(lib, "pt_tick"), pid=mine.pid):
                other.release()
                mine.release()
        finally:
            for w in (mine, other):
                if w.proc.poll() is None:
                    w.proc.kill()
        assert counts[0] == 5


def test_link_info_reports_requested_offset_and_cookie(root, target):
    # Guards the perf_event_attr size pitfall: with size < 72 config2 is dropped and the
    # probe silently lands at offset 0.
    require_perf_links()
    lib, _ = target
    offset = file_offset(lib, "pt_add")
    assert offset != 0
    with maps.ArrayMap(8, 1) as counts, counting_program(counts) as prog:
        with uprobe.attach_uprobe(prog, lib, offset, cookie=0xC0FFEE) as link:
            info = link.info()
            assert link.has_bpf_link
            assert info.type == syscalls.BPF_LINK_TYPE_PERF_EVENT
            assert info.prog_id == prog.info().id
            if not info.details:
                pytest.skip("this kernel's perf-event link info has no uprobe fields (6.6+)")
            assert info.offsets == [offset] and info.cookies == [0xC0FFEE]
            assert info.path == os.path.realpath(lib) and not info.retprobe


def test_probe_lands_at_the_requested_offset(root, target):
    # The same pitfall, seen from what runs: a probe at pt_three's offset counts its calls
    # (three per run of the caller), none of pt_tick's.
    lib, exe = target
    with maps.ArrayMap(8, 1, value_struct=U64) as counts, counting_program(counts) as prog:
        with uprobe.attach_uprobe(prog, lib, file_offset(lib, "pt_three")):
            run_caller(exe, 5)
        assert counts[0] == 3


def test_symlinks_resolve_to_the_real_file(root, target, tmp_path):
    lib, _ = target
    link_path = tmp_path / "libalias.so"
    link_path.symlink_to(lib)
    with maps.ArrayMap(8, 1) as counts, counting_program(counts) as prog:
        with uprobe.attach_uprobe(prog, str(link_path), file_offset(lib, "pt_tick")) as link:
            assert link.path == os.path.realpath(lib)
            if link.has_bpf_link:
                info = link.info()
                assert info.path == os.path.realpath(lib) or not info.details


def test_cookie_reaches_the_program(root, target):
    require_perf_links()  # (cookies came with the links, 5.15)
    lib, exe = target
    with maps.ArrayMap(8, 4, value_struct=U64) as counts, \
            counting_program(counts, by_cookie=True) as prog:
        with uprobe.attach_uprobe(prog, lib, file_offset(lib, "pt_three"), cookie=3):
            run_caller(exe, 0)
        assert [counts[i] for i in range(4)] == [0, 0, 0, 3]


needs_multi = pytest.mark.skipif("not uprobe.uprobe_multi_supported()",
                                 reason="kernel lacks uprobe_multi links")


def test_uprobe_multi_probe_is_a_bool(root):
    assert isinstance(uprobe.uprobe_multi_supported(), bool)
    assert uprobe.uprobe_multi_supported() is uprobe.uprobe_multi_supported()


@needs_multi
def test_uprobe_multi_counts_per_function_by_cookie(root, target):
    lib, exe = target
    names = ["pt_one", "pt_two", "pt_three"]
    offsets = [file_offset(lib, n) for n in names]
    with maps.ArrayMap(8, 4, value_struct=U64) as counts, \
            counting_program(counts, True, EXPECTED_UPROBE_MULTI) as prog:
        with uprobe.attach_uprobe_multi(prog, lib, offsets, cookies=[1, 2, 3]) as link:
            run_caller(exe, 0)
            run_caller(exe, 0)
            info = link.info()
        assert [counts[i] for i in range(4)] == [0, 2, 4, 6]
    assert info.offsets == offsets and info.cookies == [1, 2, 3]
    assert info.path == os.path.realpath(lib) and not info.retprobe


@needs_multi
def test_uprobe_multi_return_and_pid(root, target):
    lib, exe = target
    body = store_record(copy_reg(ARCH.ret, 0))
    with record_map() as out, Program(body, maps={"out": out}, name="mret",
                                      expected_attach_type=EXPECTED_UPROBE_MULTI).load() as prog:
        mine, other = Waiting(exe, 0), Waiting(exe, 0)
        try:
            with uprobe.attach_uprobe_multi(prog, lib, [file_offset(lib, "pt_many")],
                                            retprobe=True, pid=other.pid) as link:
                assert link.info().retprobe and link.info().pid == other.pid
                mine.release()
                assert out.get(0) is None  # other pid: not recorded
                other.release()
        finally:
            for w in (mine, other):
                if w.proc.poll() is None:
                    w.proc.kill()
        assert struct.unpack_from("<q", out[0], 0)[0] == 36


def test_uprobe_multi_needs_matching_attach_type(root, target):
    lib, _ = target
    with maps.ArrayMap(8, 1) as counts, counting_program(counts) as prog:
        with pytest.raises(ValueError, match="expected_attach_type=48"):
            uprobe.attach_uprobe_multi(prog, lib, [file_offset(lib, "pt_one")])


def test_attach_errors_name_path_offset_and_function(root, target, tmp_path):
    lib, _ = target
    with maps.ArrayMap(8, 1) as counts, counting_program(counts) as prog:
        missing = str(tmp_path / "nope.so")
        with pytest.raises(AttachError, match="cudaMalloc in .*nope.so"):
            uprobe.attach_uprobe(prog, missing, 0x10, what="cudaMalloc")
        size = os.path.getsize(lib)
        with pytest.raises(AttachError) as info:
            uprobe.attach_uprobe(prog, lib, size + 0x1000, what="pt_far")
        text = str(info.value)
        assert "pt_far in " + os.path.realpath(lib) in text and hex(size + 0x1000) in text
        with pytest.raises(AttachError, match="no such process"):
            uprobe.attach_uprobe(prog, lib, file_offset(lib, "pt_one"), pid=2 ** 22 + 12345)


def test_missing_uprobe_pmu_env(root, target, tmp_path, monkeypatch):
    lib, _ = target
    monkeypatch.setenv("EBPF_CUDA_SYSFS_UPROBE", str(tmp_path))
    with maps.ArrayMap(8, 1) as counts, counting_program(counts) as prog:
        with pytest.raises(UnsupportedKernelError, match="no uprobe perf PMU"):
            uprobe.attach_uprobe(prog, lib, file_offset(lib, "pt_one"))


def test_links_close_their_fds(root, target):
    lib, _ = target


    with maps.ArrayMap(8, 1) as counts, counting_program(counts) as prog:
        before = open_fds()
        link = uprobe.attach_uprobe(prog, lib, file_offset(lib, "pt_one"))
        # the BPF link and the perf event (before 5.15: the perf event alone)
        assert len(open_fds() - before) == (2 if perf_links() else 1)
        link.close()
        assert link.closed and open_fds() == before
        if uprobe.uprobe_multi_supported():
            multi_prog = counting_program(counts, expected_attach_type=EXPECTED_UPROBE_MULTI)
            with multi_prog:
                multi = uprobe.attach_uprobe_multi(multi_prog, lib, [file_offset(lib, "pt_one")])
                multi.close()
            assert open_fds() == before


def test_ioctl_fallback_without_perf_links(root, target, monkeypatch):
    # Force the pre-5.15 path (PERF_EVENT_IOC_SET_BPF): real ioctl, real probe.
    lib, exe = target
    monkeypatch.setitem(uprobe.features._cache, "perf_links", False)
    with maps.ArrayMap(8, 1, value_struct=U64) as counts, counting_program(counts) as prog:
        with uprobe.attach_uprobe(prog, lib, file_offset(lib, "pt_tick")) as link:
            assert not link.has_bpf_link
            with pytest.raises(ValueError, match="ioctl"):
                link.info()
            run_caller(exe, 4)
        assert counts[0] == 4
        with pytest.raises(UnsupportedKernelError, match="cookies"):
            uprobe.attach_uprobe(prog, lib, file_offset(lib, "pt_tick"), cookie=1)


def test_perf_links_probed(root, target):
    # The probe's answer is what attaching finds: a BPF link exactly when it says so.
    lib, _ = target
    assert uprobe.perf_links_supported() is uprobe.perf_links_supported()
    with maps.ArrayMap(8, 1) as counts, counting_program(counts) as prog:
        with uprobe.attach_uprobe(prog, lib, file_offset(lib, "pt_tick")) as link:
            assert link.has_bpf_link is uprobe.perf_links_supported()


def test_attach_path_follows_the_probes(root, monkeypatch):
    path = uprobe.attach_path()
    assert path in uprobe.PATHS
    assert (path == uprobe.UPROBE_MULTI) is uprobe.uprobe_multi_supported()
    monkeypatch.setitem(uprobe.features._cache, "uprobe_multi", False)
    monkeypatch.setitem(uprobe.features._cache, "perf_links", True)
    assert uprobe.attach_path() == uprobe.PERF_LINK
    monkeypatch.setitem(uprobe.features._cache, "perf_links", False)
    assert uprobe.attach_path() == uprobe.PERF_IOCTL


@pytest.mark.parametrize("perf_links", [True, False], ids=["perf_link", "ioctl"])
def test_uprobe_multi_program_attaches_per_offset(root, target, monkeypatch, perf_links):
    # The fallback from uprobe_multi links to perf-event uprobes: kernels differ in whether
    # perf-event attachment takes a program loaded for uprobe_multi (expected_attach_type
    # 48; PERF_EVENT_IOC_SET_BPF refuses it on some 6.18 builds, perf links everywhere), so
    # its copy loaded with expected_attach_type 0 is attached, once, unloaded with it.
    lib, exe = target
    if perf_links and not uprobe.perf_links_supported():
        pytest.skip("kernel lacks BPF perf-event links")
    monkeypatch.setitem(uprobe.features._cache, "perf_links", perf_links)
    with maps.ArrayMap(8, 4, value_struct=U64) as counts, \
            counting_program(counts, by_cookie=perf_links,
                             expected_attach_type=EXPECTED_UPROBE_MULTI) as prog:
        cookie = 2 if perf_links else 0
        with uprobe.attach_uprobe(prog, lib, file_offset(lib, "pt_tick"), cookie=cookie) as link, \
                uprobe.attach_uprobe(prog, lib, file_offset(lib, "pt_one"), cookie=cookie):
            assert link.has_bpf_link is perf_links
            copy = prog.for_perf_event()
            assert copy is not prog and copy.expected_attach_type == 0 and copy.loaded
            assert prog.for_perf_event() is copy  # loaded once
            run_caller(exe, 6)
        assert counts[cookie] == 6 + 1
        if not perf_links:
            with pytest.raises(UnsupportedKernelError, match="cookies"):
                uprobe.attach_uprobe(prog, lib, file_offset(lib, "pt_tick"), cookie=5)
    assert not copy.loaded


def test_perf_uprobes_past_the_open_file_limit(root, target, monkeypatch):
    # Perf-event uprobes take two descriptors each: with a soft limit lower than what they
    # need, attaching raises it (EMFILE is not the end), here from a small one.
    import resource

    lib, exe = target
    tick = file_offset(lib, "pt_tick")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 16, hard))
    links = []
    try:
        with maps.ArrayMap(8, 1, value_struct=U64) as counts, \
                counting_program(counts) as prog:
            for _ in range(40):  # 80 descriptors
                links.append(uprobe.attach_uprobe(prog, lib, tick))
            run_caller(exe, 2)
            assert counts[0] == 2 * 40
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > in_use + 80
    finally:
        for link in links:
            link.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
