"""bpf()/perf_event_open plumbing: arch table, errors, fds, verifier log, uprobe PMU parsing."""
import ctypes
import errno
import gc
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ebpf_cuda import arch, syscalls
from ebpf_cuda.errors import KernelError, PrivilegeError, UnsupportedKernelError, VerifierError
from kernel_fds import open_fds

REPO = Path(__file__).resolve().parent.parent
RET0 = bytes([0xB7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])  # r0 = 0; exit
EXIT_ONLY = bytes([0x95, 0, 0, 0, 0, 0, 0, 0])  # exit with r0 unset: rejected


# -- arch -------------------------------------------------------------------------------


def test_x86_64_table():
    x = arch.for_machine("x86_64")
    assert (x.nr_bpf, x.nr_perf_event_open) == (321, 298)
    assert [x.arg(i) for i in range(6)] == [112, 104, 96, 88, 72, 64]
    assert (x.ret, x.sp, x.ip) == (80, 152, 128)
    assert [x.stack_arg(k) for k in range(3)] == [8, 16, 24]
    with pytest.raises(ValueError):
        x.arg(6)


def test_arm64_table():
    a = arch.for_machine("aarch64")
    assert (a.nr_bpf, a.nr_perf_event_open) == (280, 241)
    assert a.args == (0, 8, 16, 24, 32, 40, 48, 56)
    assert (a.ret, a.sp, a.ip) == (0, 248, 256)
    assert a.stack_arg(1) == 8


def test_current_picks_machine_and_rejects_unknown():
    if os.uname().machine == "x86_64":
        assert arch.current() is arch.X86_64
    with pytest.raises(UnsupportedKernelError, match="unsupported CPU architecture"):
        arch.for_machine("sparc64")


# -- errors -----------------------------------------------------------------------------


def test_kernel_error_classes_and_sentences():
    perm = syscalls.kernel_error("loading eBPF program 'x'", errno.EPERM)
    assert isinstance(perm, PrivilegeError) and perm.errno == errno.EPERM
    assert "CAP_BPF" in str(perm) and "CAP_PERFMON" in str(perm)
    other = syscalls.kernel_error("creating map 'm'", errno.EINVAL)
    assert type(other) is KernelError
    assert str(other) == "creating map 'm' failed: Invalid argument (EINVAL)"


def test_bad_object_names():
    for name in ("cuda-launch", "x" * 16, "sp ace"):
        with pytest.raises(ValueError, match="bad eBPF object name"):
            syscalls.check_name(name)
    assert syscalls.check_name("cuda.launch_15c") == b"cuda.launch_15c"


@pytest.mark.kernel
def test_map_create_error_names_operation(root):
    with pytest.raises(KernelError) as info:
        syscalls.map_create(syscalls.BPF_MAP_TYPE_RINGBUF, 0, 0, 1000, name="rb")
    assert info.value.errno == errno.EINVAL
    assert "creating map 'rb'" in str(info.value) and "EINVAL" in str(info.value)


# -- fds --------------------------------------------------------------------------------


@pytest.mark.kernel
def test_fd_close_context_and_gc(root):
    before = open_fds()
    fd = syscalls.map_create(syscalls.BPF_MAP_TYPE_ARRAY, 4, 8, 1)
    number = fd.value
    assert str(number) in open_fds()
    fd.close()
    fd.close()  # idempotent
    assert fd.closed and open_fds() == before
    with pytest.raises(ValueError, match="closed"):
        fd.value
    with syscalls.map_create(syscalls.BPF_MAP_TYPE_ARRAY, 4, 8, 1) as fd2:
        assert str(fd2.value) in open_fds()
    assert open_fds() == before
    syscalls.map_create(syscalls.BPF_MAP_TYPE_ARRAY, 4, 8, 1)  # dropped at once
    gc.collect()
    assert open_fds() == before


# -- program load and the verifier log --------------------------------------------------


@pytest.mark.kernel
def test_prog_load_and_info(root):
    fd, log = syscalls.prog_load(RET0, name="ret0", log_level=1)
    with fd:
        assert "processed 2 insns" in log
        info = syscalls.prog_info(fd.value)
        assert (info.type, info.name) == (syscalls.BPF_PROG_TYPE_KPROBE, "ret0")
        assert info.id > 0 and len(info.tag) == 8


@pytest.mark.kernel
def test_verifier_error_carries_log(root):
    with pytest.raises(VerifierError) as info:
        syscalls.prog_load(EXIT_ONLY, name="noret")
    err = info.value
    assert "R0 !read_ok" in err.log and "processed 1 insns" in err.log
    assert "R0 !read_ok" in str(err) and "'noret'" in str(err)
    assert err.errno == errno.EACCES


@pytest.mark.kernel
def test_verifier_log_grows_on_enospc(root, monkeypatch):
    # Far too small (and below the 128 bytes that kernels before 6.4 require at least): the
    # kernel says ENOSPC (6.4+: with the size needed; before: without), the log grows.
    monkeypatch.setattr(syscalls, "_LOG_START", 32)
    movs = b"".join(bytes([0xB7, 1, 0, 0, i, 0, 0, 0]) for i in range(40))  # r1 = i
    with pytest.raises(VerifierError) as info:
        syscalls.prog_load(movs + EXIT_ONLY, name="noret")
    log = info.value.log
    assert "R0 !read_ok" in log and "processed 41 insns" in log and len(log) > 4 * 128


def test_prog_load_rejects_bad_length():
    with pytest.raises(ValueError):
        syscalls.prog_load(b"\x95\0\0")


PRIVILEGE_SCRIPT = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[1])
    from ebpf_cuda import syscalls
    from ebpf_cuda.errors import PrivilegeError
    os.setgroups([])
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)  # leaving uid 0 drops every capability
    try:
        syscalls.prog_load(bytes.fromhex(sys.argv[2]), name="x")
    except PrivilegeError as err:
        print(err)
        sys.exit(err.exit_code)
    print("loaded")
""")


@pytest.mark.kernel
def test_eperm_as_nobody_names_capabilities(root):
    # The imports run as root (the interpreter may live under /root), then the script becomes
    # nobody; a kprobe program load always needs CAP_BPF + CAP_PERFMON.
    proc = subprocess.run([sys.executable, "-c", PRIVILEGE_SCRIPT, str(REPO), RET0.hex()],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == PrivilegeError.exit_code, proc.stderr
    assert "permission denied" in proc.stdout
    assert "CAP_BPF" in proc.stdout and "CAP_PERFMON" in proc.stdout


# -- perf_event_attr and the uprobe PMU ------------------------------------------------


def fake_pmu(tmp_path: Path, type_: str = "42", retprobe: str = "config:5") -> Path:
    (tmp_path / "format").mkdir()
    (tmp_path / "type").write_text(type_ + "\n")
    (tmp_path / "format" / "retprobe").write_text(retprobe + "\n")
    (tmp_path / "format" / "ref_ctr_offset").write_text("config:32-63\n")
    return tmp_path


def test_uprobe_pmu_reads_type_and_bits_from_sysfs(tmp_path):
    pmu = syscalls.uprobe_pmu(str(fake_pmu(tmp_path)))
    assert pmu == syscalls.UprobePmu(42, 5, 32)
    path = ctypes.create_string_buffer(b"/lib/x.so")
    attr = syscalls.uprobe_attr(pmu, path, 0x1234, retprobe=True, ref_ctr_offset=0x10)
    assert len(attr) == 136
    type_, size, config = struct.unpack_from("<IIQ", attr, 0)
    assert (type_, size, config) == (42, 136, (1 << 5) | (0x10 << 32))
    config1, config2 = struct.unpack_from("<QQ", attr, 56)
    assert config1 == ctypes.addressof(path) and config2 == 0x1234
    assert struct.unpack_from("<Q", attr, 40)[0] == 0  # not disabled, no inherit


def test_out_of_file_descriptors_is_no_missing_pmu(tmp_path):
    """With no descriptor left (a low `ulimit -n`) the PMU is unreadable, not absent: a
    KernelError with EMFILE (the CLI's "too many open files" line), never the "no uprobe PMU"
    of exit 7 that sent 6.1's users to their kernel (perf-event uprobes read sysfs there)."""
    code = ("import os, resource, sys\n"
            "from ebpf_cuda import syscalls\n"
            "from ebpf_cuda.errors import KernelError, UnsupportedKernelError\n"
            "fds = len(os.listdir('/proc/self/fd'))\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (fds - 1, fds - 1))\n"
            "try:\n"
            "    syscalls.uprobe_pmu(sys.argv[1])\n"
            "except UnsupportedKernelError as err:\n"
            "    print('unsupported', err)\n"
            "except KernelError as err:\n"
            "    print('kernel', err.errno, err)\n")
    done = subprocess.run([sys.executable, "-c", code, str(fake_pmu(tmp_path))],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split()[:2] == ["kernel", str(errno.EMFILE)], done.stdout + done.stderr
    assert "Too many open files" in done.stdout


def test_real_uprobe_pmu():
    if not os.path.exists(syscalls.UPROBE_PMU_DIR):
        pytest.skip("no uprobe PMU")
    pmu = syscalls.uprobe_pmu()
    assert pmu.type > 0 and pmu.retprobe_bit == 0 and pmu.ref_ctr_shift == 32


def test_missing_pmu_by_parameter_and_env(tmp_path, monkeypatch):
    with pytest.raises(UnsupportedKernelError, match="no uprobe perf PMU"):
        syscalls.uprobe_pmu(str(tmp_path))
    monkeypatch.setenv(syscalls.UPROBE_PMU_ENV, str(tmp_path))
    with pytest.raises(UnsupportedKernelError, match="CONFIG_UPROBE_EVENTS"):
        syscalls.perf_event_open_uprobe("/bin/true", 0)


@pytest.mark.kernel
def test_perf_event_open_failure_names_probe(root):
    with pytest.raises(KernelError) as info:
        syscalls.perf_event_open_uprobe("/nonexistent/lib.so", 0x40)
    assert info.value.errno == errno.ENOENT
    assert "/nonexistent/lib.so:0x40" in str(info.value)


def test_the_callers_return_address_comes_from_lr_on_arm64_and_from_sp_on_x86_64():
    """At a function's entry x86-64's `call` has pushed the return address at [sp]; arm64's
    `bl` left it in x30 (lr): the launch rows' caller cell is loaded from there."""
    from ebpf_cuda import asm
    from ebpf_cuda.asm import DW, FP, R6
    from ebpf_cuda.probes.arguments import load_args
    from ebpf_cuda.spec import apis

    api = apis.BY_NAME["cudaLaunchKernel"]
    lr_load = asm.ldx(DW, asm.R1, R6, arch.ARM64.link_register)
    arm = load_args(api, arch.ARM64, R6, FP, -256)
    x86 = load_args(api, arch.X86_64, R6, FP, -256)
    assert arch.ARM64.link_register == 240  # regs[30]
    assert lr_load in arm and lr_load not in x86
    sp_load = asm.ldx(DW, asm.R3, R6, arch.X86_64.sp)
    assert sp_load in x86
