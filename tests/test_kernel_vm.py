"""The kernel matrix's own pieces (scripts/kernel_vm.py): no kernel is booted here."""
import gzip
import os
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@pytest.fixture(scope="module")
def vm():
    spec = importlib.util.spec_from_file_location("kernel_vm", SCRIPTS / "kernel_vm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_module_names_drop_suffixes_and_dashes(vm):
    assert vm.module_name("9pnet_virtio.ko.xz") == "9pnet_virtio"
    assert vm.module_name("virtio-pci.ko") == "virtio_pci"
    assert vm.module_name("overlay.ko.zst") == "overlay"


def test_depends_come_from_modinfo(vm):
    code = b"\x7fELF...\0license=GPL\0depends=netfs,9pnet\0vermagic=6.1\0"
    assert vm.modinfo_depends(code) == ["netfs", "9pnet"]
    assert vm.modinfo_depends(b"\0depends=\0") == []
    assert vm.modinfo_depends(b"no modinfo") == []


def test_modules_come_dependencies_first_and_skip_built_ins(vm, tmp_path):
    kernel = tmp_path / "lib" / "modules" / "9.9" / "kernel"
    (kernel / "fs").mkdir(parents=True)
    (kernel / "fs" / "9p.ko").write_bytes(b"\0depends=9pnet,netfs\0")
    (kernel / "fs" / "netfs.ko").write_bytes(b"\0depends=\0")
    (kernel / "fs" / "9pnet.ko").write_bytes(b"\0depends=virtio\0")
    (kernel / "fs" / "virtio.ko").write_bytes(b"\0depends=\0")
    (tmp_path / "lib" / "modules" / "9.9" / "modules.builtin").write_text(
        "kernel/drivers/virtio/virtio.ko\n")
    names = [name for name, _ in vm.modules_for(str(kernel.parent), ("9p",))]
    assert names == ["9pnet", "netfs", "9p"]  # virtio is built in


def test_cpio_archive_is_read_by_cpio(vm, tmp_path):
    if subprocess.run(["sh", "-c", "command -v cpio"], capture_output=True).returncode:
        pytest.skip("no cpio here")
    archive = vm.cpio_newc([("dir", 0o040755, None), ("dir/file", 0o100644, b"hello\n")])
    done = subprocess.run(["cpio", "-idm", "--quiet"], input=archive, cwd=str(tmp_path),
                          capture_output=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "dir" / "file").read_bytes() == b"hello\n"


def test_cpio_entries_are_aligned_and_end_with_the_trailer(vm):
    archive = vm.cpio_newc([("a", 0o100644, b"xyz")])
    assert archive.startswith(b"070701") and len(archive) % 4 == 0
    assert b"TRAILER!!!" in archive
    assert gzip.decompress(gzip.compress(archive)) == archive


def test_static_elf_is_told_from_a_dynamic_one(vm, tmp_path):
    assert not vm.is_static_elf(sys.executable) or "static" in sys.executable
    assert not vm.is_static_elf(str(tmp_path / "missing"))
    (tmp_path / "text").write_text("#!/bin/sh\n")
    assert not vm.is_static_elf(str(tmp_path / "text"))


def test_kernels_sh_says_how_to_use_it():
    done = subprocess.run(["bash", str(SCRIPTS / "kernels.sh")], capture_output=True,
                          text=True)
    assert done.returncode == 2 and "VERSION -- CMD" in done.stderr


# kernels.sh against a stand-in apt (apt-get and apt-cache first on PATH): what it asks apt
# for, and when.
FAKE_APT_GET = r"""#!/bin/sh
echo "apt-get $*" >> "$FAKE_APT/log"
[ -e "$FAKE_APT/offline" ] && { echo "E: Some index files failed to download" >&2; exit 100; }
for word in "$@"; do
    case "$word" in
        update)
            n=$(cat "$FAKE_APT/locked" 2>/dev/null || echo 0)
            if [ "$n" -gt 0 ]; then
                echo $((n - 1)) > "$FAKE_APT/locked"
                echo "E: Could not get lock /var/lib/apt/lists/lock." \
                     "It is held by process 1 (apt-get)" >&2
                exit 100
            fi
            touch "$FAKE_APT/updated"; exit 0 ;;
        download) [ -e "$FAKE_APT/updated" ] || exit 100
            cp "$FAKE_APT/kernel.deb" "./linux-image-9.9.0-1-amd64_9.9-1_amd64.deb"; exit 0 ;;
        install) exit 0 ;;
    esac
done
"""
FAKE_APT_CACHE = r"""#!/bin/sh
echo "apt-cache $*" >> "$FAKE_APT/log"
for pattern; do :; done  # (the last argument)
[ -e "$FAKE_APT/updated" ] && echo linux-image-9.9.0-1-amd64 | grep -E "$pattern" \
    | sed 's/$/ - Linux 9.9 (stand-in)/'
exit 0
"""
RELEASE = "9.9.0-1-amd64"


def _fake_apt(tmp_path):
    apt = tmp_path / "apt"
    (apt / "bin").mkdir(parents=True)
    for name, text in (("apt-get", FAKE_APT_GET), ("apt-cache", FAKE_APT_CACHE)):
        (apt / "bin" / name).write_text(text)
        (apt / "bin" / name).chmod(0o755)
    package = apt / "pkg"
    (package / "DEBIAN").mkdir(parents=True)
    (package / "DEBIAN" / "control").write_text(
        "Package: linux-image-%s\nVersion: 9.9-1\nArchitecture: amd64\nMaintainer: t <t@t>\n"
        "Description: stand-in\n" % RELEASE)
    (package / "boot").mkdir()
    (package / "boot" / ("vmlinuz-" + RELEASE)).write_bytes(b"not a kernel")
    (package / "lib" / "modules" / RELEASE / "kernel").mkdir(parents=True)
    subprocess.run(["dpkg-deb", "--build", str(package), str(apt / "kernel.deb")],
                   check=True, capture_output=True)
    return apt


def _kernels_sh(apt, cache, *args):
    import os
    env = dict(os.environ, PATH="%s:%s" % (apt / "bin", os.environ["PATH"]), FAKE_APT=str(apt),
               EBPF_CUDA_KERNELS=str(cache), EBPF_CUDA_APT_RETRY_S="0")
    return subprocess.run(["bash", str(SCRIPTS / "kernels.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=120)


def _needs_tools():
    for tool in ("dpkg-deb", "qemu-system-x86_64"):
        if subprocess.run(["sh", "-c", "command -v " + tool], capture_output=True).returncode:
            pytest.skip("no %s here" % tool)


def test_kernels_sh_waits_out_apt_locks_then_unpacks_the_kernel(tmp_path):
    _needs_tools()
    apt = _fake_apt(tmp_path)
    (apt / "locked").write_text("2")  # another apt holds the lists lock for two tries
    done = _kernels_sh(apt, tmp_path / "cache", "--fetch", RELEASE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "cache" / RELEASE)
    assert (tmp_path / "cache" / RELEASE / "boot" / ("vmlinuz-" + RELEASE)).exists()
    assert done.stderr.count("apt is busy") == 2
    calls = (apt / "log").read_text().splitlines()
    assert sum("update" in c for c in calls) == 3
    assert sum(" download linux-image-" + RELEASE in c for c in calls) == 1
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]


def test_kernels_sh_uses_an_unpacked_kernel_without_apt(tmp_path):
    _needs_tools()
    apt = _fake_apt(tmp_path)
    assert _kernels_sh(apt, tmp_path / "cache", "--fetch", RELEASE).returncode == 0
    (apt / "log").unlink()
    (apt / "updated").unlink()  # apt now knows nothing and cannot learn (offline)
    (apt / "offline").touch()
    done = _kernels_sh(apt, tmp_path / "cache", "--fetch", RELEASE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "cache" / RELEASE)
    assert not (apt / "log").exists()
    # --refresh asks apt, and with apt offline still takes the unpacked kernel
    done = _kernels_sh(apt, tmp_path / "cache", "--refresh", "--fetch", RELEASE)
    assert done.returncode == 0 and done.stdout.strip() == str(tmp_path / "cache" / RELEASE)
    assert "apt-get -qq -o DPkg::Lock::Timeout=300 update" in (apt / "log").read_text()


def test_kernels_sh_reports_an_unknown_kernel_as_usage(tmp_path):
    _needs_tools()
    apt = _fake_apt(tmp_path)
    done = _kernels_sh(apt, tmp_path / "cache", "--fetch", "4.4.0-1-amd64")
    assert done.returncode == 2 and "no kernel package for 4.4.0-1-amd64" in done.stderr


# kernel_vm.py with a stand-in QEMU ($QEMU): the guest never outlives the script.
FAKE_QEMU = r"""#!/bin/sh
echo $$ > "$FAKE_QEMU_DIR/pid"
for arg; do
    case "$arg" in local,id=out,path=*) out="${arg#local,id=out,path=}"; out="${out%%,*}" ;; esac
done
if [ "$FAKE_QEMU_BOOTS" = 1 ]; then
    echo 9.9.0-1-amd64 > "$out/uname"; echo started > "$out/started"
    echo "from the guest" > "$out/output"
fi
exec sleep 1000
"""


def _fake_kernel(tmp_path):
    kernel = tmp_path / "k" / RELEASE
    (kernel / "boot").mkdir(parents=True)
    (kernel / "boot" / ("vmlinuz-" + RELEASE)).write_bytes(b"not a kernel")
    (kernel / "lib" / "modules" / RELEASE / "kernel").mkdir(parents=True)
    qemu = tmp_path / "qemu"
    qemu.write_text(FAKE_QEMU)
    qemu.chmod(0o755)
    return kernel, qemu


def _start_vm(tmp_path, boots, *options):
    import os
    kernel, qemu = _fake_kernel(tmp_path)
    env = dict(os.environ, QEMU=str(qemu), FAKE_QEMU_DIR=str(tmp_path),
               FAKE_QEMU_BOOTS="1" if boots else "0")
    return subprocess.Popen([sys.executable, str(SCRIPTS / "kernel_vm.py"), *options,
                             str(kernel), "--", "true"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _qemu_pid(tmp_path):
    import time
    for _ in range(200):
        if (tmp_path / "pid").exists() and (tmp_path / "pid").read_text().strip():
            return int((tmp_path / "pid").read_text())
        time.sleep(0.05)
    raise AssertionError("the stand-in QEMU never started")


def _gone(pid):
    import os
    import time
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return True  # dead, not yet reaped by its parent
        except OSError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_stop_signal_takes_the_guest_down(tmp_path, sig):
    import os
    import signal
    vm = _start_vm(tmp_path, False)
    qemu = _qemu_pid(tmp_path)
    os.kill(vm.pid, getattr(signal, sig))
    vm.communicate(timeout=30)
    assert vm.returncode == 128 + getattr(signal, sig)
    assert _gone(qemu)


def test_a_killed_runner_takes_the_guest_down(tmp_path):
    vm = _start_vm(tmp_path, False)
    qemu = _qemu_pid(tmp_path)
    vm.kill()  # SIGKILL: no handler runs; the guest's death signal does it
    vm.communicate(timeout=30)
    assert _gone(qemu)


def test_no_boot_in_time_is_retried_then_125(tmp_path):
    vm = _start_vm(tmp_path, False, "--boot-timeout", "1", "--attempts", "2")
    _, err = vm.communicate(timeout=60)
    assert vm.returncode == 125
    assert err.count("no boot within 1 s") == 2 and "in 2 attempts" in err
    assert _gone(int((tmp_path / "pid").read_text()))


def test_a_command_past_its_timeout_is_stopped_with_124(tmp_path):
    vm = _start_vm(tmp_path, True, "--timeout", "1")
    out, err = vm.communicate(timeout=60)
    assert vm.returncode == 124, err
    assert out == "from the guest\n"
    assert "ran past 1 s: stopped" in err
    assert _gone(int((tmp_path / "pid").read_text()))


def test_a_stopped_matrix_takes_its_guests_down(tmp_path):
    """SIGTERM to kernel_matrix.sh (CI's timeout) reaches each guest's runner (kernels.sh,
    then kernel_vm.py), which stops its QEMU; the kernel comes from the cache, no apt."""
    import os
    import signal
    _needs_tools()
    kernel, qemu = _fake_kernel(tmp_path)
    apt = _fake_apt(tmp_path)
    env = dict(os.environ, QEMU=str(qemu), FAKE_QEMU_DIR=str(tmp_path), FAKE_QEMU_BOOTS="0",
               EBPF_CUDA_KERNELS=str(kernel.parent), KERNELS=RELEASE, FAKE_APT=str(apt),
               PATH="%s:%s" % (apt / "bin", os.environ["PATH"]))
    matrix = subprocess.Popen(["bash", str(SCRIPTS / "kernel_matrix.sh")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    guest = _qemu_pid(tmp_path)
    matrix.send_signal(signal.SIGTERM)
    out, _ = matrix.communicate(timeout=60)
    assert matrix.returncode == 143, out
    assert _gone(guest)
    assert not (apt / "log").exists()


def test_arm64_guests_get_qemu_aarch64_their_own_root_and_the_checkout(vm, tmp_path):
    """--arch arm64: qemu-system-aarch64's virt machine with its PL011 console, the arm64
    userland as the root share and the checkout (the current folder) as a share of its own;
    x86-64 guests share this machine's root and nothing else."""
    arm = vm.qemu_command("Image", "initrd", str(tmp_path), 1, "4G", "", "arm64",
                          "/cache/arm64-root")
    assert arm[0].endswith("qemu-system-aarch64") or "QEMU" in os.environ
    assert "virt,gic-version=3" in arm and "console=ttyAMA0" in arm[arm.index("-append") + 1]
    fsdevs = [arm[i + 1] for i, word in enumerate(arm) if word == "-fsdev"]
    assert fsdevs[0].startswith("local,id=root,path=/cache/arm64-root,")
    assert "local,id=checkout,path=%s,security_model=none,readonly=on,multidevs=remap" \
        % os.getcwd() in fsdevs
    x86 = vm.qemu_command("bzImage", "initrd", str(tmp_path), 1, "4G", "")
    assert "q35" in x86 and "console=ttyS0" in x86[x86.index("-append") + 1]
    fsdevs = [x86[i + 1] for i, word in enumerate(x86) if word == "-fsdev"]
    assert fsdevs[0].startswith("local,id=root,path=/,") and len(fsdevs) == 2
