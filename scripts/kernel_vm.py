#!/usr/bin/env python3
"""Boot an extracted Debian kernel in QEMU (TCG) on the host's own filesystem and run a
command in it as root; exit with the command's status. Driven by scripts/kernels.sh, which
downloads and extracts the kernel package; stdlib only.

    kernel_vm.py KERNEL_DIR -- CMD...

KERNEL_DIR is what `dpkg -x linux-image-VERSION_*.deb KERNEL_DIR` left (boot/vmlinuz-*,
lib/modules/VERSION). The guest:

- boots from a small initramfs built here (cached in KERNEL_DIR): a static busybox and the
  modules that mounting the host's root needs (virtio, 9p, overlay), in dependency order
  (read from each module's .modinfo: no depmod needed);
- mounts the host's root over 9p, read-only (cache=loose: Python starts 3-4x faster), with
  fresh /proc, /sys, /dev, and tmpfs on /tmp, /var/tmp, /run, /dev/shm; the current folder
  (the repository) gets an overlay with its upper layer in tmpfs, so the guest may write
  there too (caches, build outputs) and nothing reaches the host (an overlay over the whole
  root would slow every path lookup: Python started 2-3x slower);
- runs CMD with `sh -c` in the current directory, with this environment's PATH, as root; its
  output goes to a file in a read-write share that this script copies to stdout as it grows.

A boot that does not reach the command within --boot-timeout seconds (an early oops under
TCG happens about once in 20 boots) is retried, up to --attempts times. Exit status: the
command's; 124 when it ran past --timeout; 125 when no boot reached it.
"""
import argparse
import gzip
import io
import lzma
import os
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from typing import Optional

WANTED_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")
BOOT_MARK = "started"
OOPS = re.compile(r"Oops|BUG:|Kernel panic|general protection fault|kernel BUG")

INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules.list); do
    insmod "/modules/$m" || echo "ebpf-cuda-vm: insmod $m failed"
done
mkdir -p /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /newroot \
    || { echo "ebpf-cuda-vm: cannot mount the host's root"; reboot -f; }
out=$(cat /outdir)
mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=512000 out "/newroot$out"
# (a root other than the host's: the checkout comes as a share of its own)
if [ -f /checkout-path ]; then
    mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 checkout \
        "/newroot$(cat /checkout-path)" || echo "ebpf-cuda-vm: cannot mount the checkout"
fi
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
# The host's root becomes the root (not a chroot: /proc/PID/root, mount namespaces and
# paths seen through them must look as on a real machine); guest.sh, now PID 1, reboots.
exec switch_root /newroot /bin/sh "$out/guest.sh"
"""

GUEST = r"""#!/bin/sh
# Runs in the guest as PID 1, the host's root its root (see kernel_vm.py).
out=%(out)s
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts 2>/dev/null
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
# The current folder (the repository) is writable through an overlay; the rest of the
# host's root stays read-only (an overlay over all of it makes every lookup slower).
mkdir -p /tmp/.overlay/upper /tmp/.overlay/work
mount -t overlay -o lowerdir=%(cwd)s,upperdir=/tmp/.overlay/upper,workdir=/tmp/.overlay/work \
    overlay %(cwd)s || echo "ebpf-cuda-vm: %(cwd)s stays read-only (no overlay)"
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /var/tmp
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
ln -sf /proc/self/fd /dev/fd 2>/dev/null  # as udev makes them
ln -sf /proc/self/fd/0 /dev/stdin 2>/dev/null
ln -sf /proc/self/fd/1 /dev/stdout 2>/dev/null
ln -sf /proc/self/fd/2 /dev/stderr 2>/dev/null
hostname ebpf-cuda-vm 2>/dev/null
ip link set lo up 2>/dev/null
export PATH=%(path)s HOME=%(home)s CI=%(ci)s TERM=dumb LANG=C.UTF-8
export PYTHONDONTWRITEBYTECODE=1 XDG_CACHE_HOME=/tmp/.cache
%(env)s
cd %(cwd)s || exit 126
uname -r > "$out/uname"
echo started > "$out/%(mark)s"
sh -c %(cmd)s > "$out/output" 2>&1 < /dev/null
echo $? > "$out/rc"
sync
echo b > /proc/sysrq-trigger  # reboot at once: QEMU (-no-reboot) exits
sleep 60  # (PID 1 must not exit first: that is a panic, which panic=-1 also ends)
"""


def module_name(filename: str) -> str:
    return re.sub(r"\.ko(\.xz|\.zst|\.gz)?$", "", filename).replace("-", "_")


def read_module(path: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".xz"):
        return lzma.decompress(data)
    if path.endswith(".gz"):
        return gzip.decompress(data)
    if path.endswith(".zst"):
        return subprocess.run(["zstd", "-dc", path], check=True, capture_output=True).stdout
    return data


def modinfo_depends(code: bytes) -> list:
    """The `depends=` of a module's .modinfo (a NUL-separated key=value list)."""
    m = re.search(rb"(?:^|\0)depends=([^\0]*)", code)
    if not m:
        return []
    return [d.decode().replace("-", "_") for d in m.group(1).split(b",") if d]


def modules_for(moddir: str, wanted=WANTED_MODULES) -> list:
    """[(name, code)] of `wanted` and what they depend on, dependencies first; modules built
    into the kernel (modules.builtin) are left out."""
    files = {}
    for folder, _, names in os.walk(os.path.join(moddir, "kernel")):
        for name in names:
            if ".ko" in name:
                files[module_name(name)] = os.path.join(folder, name)
    builtin = set()
    try:
        with open(os.path.join(moddir, "modules.builtin")) as f:
            builtin = {module_name(os.path.basename(line.strip())) for line in f}
    except OSError:
        pass
    order, codes = [], {}

    def visit(name: str) -> None:
        if name in codes or name in builtin:
            return
        if name not in files:
            return  # neither a module nor listed as built in: assume built in
        codes[name] = read_module(files[name])
        for dep in modinfo_depends(codes[name]):
            visit(dep)
        order.append(name)

    for name in wanted:
        visit(name)
    return [(name, codes[name]) for name in order]


def cpio_newc(entries) -> bytes:
    """A newc cpio archive of (path, mode, data) entries (directories: data None)."""
    out = io.BytesIO()
    for ino, (path, mode, data) in enumerate(list(entries) + [("TRAILER!!!", 0, b"")], 1):
        data = data or b""
        name = path.encode() + b"\0"
        nlink = 2 if mode & 0o040000 else 1
        header = "070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x" % (
            ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name), 0)
        out.write(header.encode() + name)
        out.write(b"\0" * (-out.tell() % 4))
        out.write(data)
        out.write(b"\0" * (-out.tell() % 4))
    return out.getvalue()


def is_static_elf(path: str) -> bool:
    """A 64-bit little-endian ELF file without a program interpreter (PT_INTERP)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:5] != b"\x7fELF\x02" or head[5] != 1:
                return False
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False
    return all(struct.unpack_from("<I", table, i * phentsize)[0] != 3 for i in range(phnum))


def find_busybox(root: str = "/") -> Optional[str]:
    env = os.environ.get("BUSYBOX") if root == "/" else None
    for path in (env, os.path.join(root, "bin/busybox"), os.path.join(root, "usr/bin/busybox")):
        if path and os.path.isfile(path) and is_static_elf(path):
            return path
    return None


def build_initramfs(kernel_dir: str, release: str, outdir: str, root: str = "/",
                    checkout: str = "") -> str:
    """The initramfs for this kernel (cached beside it; the output folder is in /outdir,
    the checkout's path, where it is a share of its own, in /checkout-path). Its busybox is the
    root's (the guest's architecture)."""
    moddir = os.path.join(kernel_dir, "lib", "modules", release)
    cached = os.path.join(kernel_dir, "ebpf-cuda-initrd.cpio.gz")
    busybox = find_busybox(root)
    if busybox is None:
        sys.exit("kernel_vm: needs a static busybox (apt-get install busybox-static)")
    stamp = "%s %d" % (busybox, os.stat(busybox).st_mtime_ns)
    if not (os.path.exists(cached) and _read(cached + ".stamp") == stamp + INIT):
        mods = modules_for(moddir)
        with open(busybox, "rb") as f:
            bb = f.read()
        entries = [("bin", 0o040755, None), ("dev", 0o040755, None), ("proc", 0o040755, None),
                   ("sys", 0o040755, None), ("modules", 0o040755, None),
                   ("bin/busybox", 0o100755, bb), ("init", 0o100755, INIT.encode()),
                   ("modules.list", 0o100644,
                    "".join("%s.ko\n" % n for n, _ in mods).encode())]
        entries += [("modules/%s.ko" % n, 0o100644, code) for n, code in mods]
        with open(cached + ".tmp", "wb") as f:
            f.write(gzip.compress(cpio_newc(entries), 1))
        os.replace(cached + ".tmp", cached)
        with open(cached + ".stamp", "w") as f:
            f.write(stamp + INIT)
    # The per-run part (where the output share is mounted) goes in a second archive: the
    # kernel unpacks concatenated archives in turn.
    extra = os.path.join(outdir, "initrd-run.cpio.gz")
    with open(cached, "rb") as f, open(extra, "wb") as g:
        g.write(f.read())
        entries = [("outdir", 0o100644, outdir.encode())]
        if checkout:
            entries.append(("checkout-path", 0o100644, checkout.encode()))
        g.write(gzip.compress(cpio_newc(entries), 1))
    return extra


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def kernel_image(kernel_dir: str) -> tuple:
    boot = os.path.join(kernel_dir, "boot")
    images = sorted(n for n in os.listdir(boot) if n.startswith("vmlinuz-"))
    if not images:
        sys.exit("kernel_vm: no boot/vmlinuz-* in %s" % kernel_dir)
    return os.path.join(boot, images[-1]), images[-1][len("vmlinuz-"):]


# Per architecture: QEMU, its machine and CPU, the serial console, extra kernel options.
MACHINES = {
    "amd64": ("qemu-system-x86_64", ["-machine", "q35"], "max", "ttyS0",
              "tsc=unstable"),
    # (virt: virtio over PCIe as on q35; cortex-a72 rather than max: no pointer
    # authentication to emulate, which made every function's entry and return slower)
    "arm64": ("qemu-system-aarch64", ["-machine", "virt,gic-version=3"], "cortex-a72",
              "ttyAMA0", ""),
}


def qemu_command(image: str, initrd: str, outdir: str, cpus: int, memory: str,
                 append: str, arch: str = "amd64", root: str = "/") -> list:
    qemu, machine, cpu, console, extra = MACHINES[arch]
    cmdline = ("console=%s loglevel=4 panic=-1 rdinit=/init mitigations=off "
               "random.trust_cpu=on %s %s" % (console, extra, append)).strip()
    command = [os.environ.get("QEMU", qemu),
               "-accel", "tcg,thread=multi", "-cpu", os.environ.get("QEMU_CPU", cpu),
               "-smp", str(cpus), "-m", memory] + machine + [
               "-nodefaults", "-no-user-config", "-display", "none",
               "-no-reboot", "-kernel", image, "-initrd", initrd, "-append", cmdline,
               "-chardev", "file,id=console,path=%s" % os.path.join(outdir, "console.log"),
               "-serial", "chardev:console",
               "-fsdev", "local,id=root,path=%s,security_model=none,readonly=on,"
               "multidevs=remap" % root,
               "-device", "virtio-9p-pci,fsdev=root,mount_tag=hostroot",
               "-fsdev", "local,id=out,path=%s,security_model=none" % outdir,
               "-device", "virtio-9p-pci,fsdev=out,mount_tag=out"]
    if root != "/":  # (another root: the checkout is shared into it at its own path)
        command += ["-fsdev", "local,id=checkout,path=%s,security_model=none,readonly=on,"
                    "multidevs=remap" % os.getcwd(),
                    "-device", "virtio-9p-pci,fsdev=checkout,mount_tag=checkout"]
    return command


def write_guest_script(outdir: str, command: str, env: dict) -> None:
    exports = "\n".join("export %s=%s" % (k, shlex.quote(v)) for k, v in sorted(env.items()))
    text = GUEST % {"out": shlex.quote(outdir), "path": shlex.quote(os.environ.get("PATH", "")),
                    "home": shlex.quote(os.environ.get("HOME", "/root")),
                    "ci": shlex.quote(os.environ.get("CI", "")), "env": exports,
                    "cwd": shlex.quote(os.getcwd()), "mark": BOOT_MARK,
                    "cmd": shlex.quote(command)}
    with open(os.path.join(outdir, "guest.sh"), "w") as f:
        f.write(text)


class Tail:
    """Copies what a growing file gains to a stream."""

    def __init__(self, path: str, stream) -> None:
        self.path, self.stream, self.pos = path, stream, 0

    def pump(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except OSError:
            return
        if data:
            self.pos += len(data)
            self.stream.write(data)
            self.stream.flush()


def boot_once(args, image: str, release: str, command: str, attempt: int) -> tuple:
    """-> (status or None when the boot did not reach the command, boot seconds, run seconds)"""
    outdir = tempfile.mkdtemp(prefix="ebpf-cuda-vm-", dir=args.workdir)
    proc = None
    try:
        checkout = ""
        if args.root != "/":  # (mount points for the shares, made in the other root)
            checkout = os.getcwd()
            for path in (checkout, outdir):
                os.makedirs(args.root + path, exist_ok=True)
        initrd = build_initramfs(args.kernel_dir, release, outdir, args.root, checkout)
        write_guest_script(outdir, command, dict(e.split("=", 1) for e in args.env))
        qemu = qemu_command(image, initrd, outdir, args.cpus, args.memory, args.append,
                            args.arch, args.root)
        start = time.monotonic()
        proc = subprocess.Popen(qemu, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_parent)
        _running.append(proc)
        tail = Tail(os.path.join(outdir, "output"), sys.stdout.buffer)
        mark = os.path.join(outdir, BOOT_MARK)
        booted_at = done_at = None
        status = None
        while True:
            time.sleep(0.5)
            tail.pump()
            now = time.monotonic()
            if booted_at is None and os.path.exists(mark):
                booted_at = now
                log("%s booted in %.1f s (attempt %d)" % (_read(os.path.join(outdir, "uname"))
                                                           .strip() or release,
                                                           now - start, attempt))
            if proc.poll() is not None:
                break
            if done_at is None and os.path.exists(os.path.join(outdir, "rc")):
                done_at = now
            if done_at is not None and now - done_at > SHUTDOWN_GRACE:
                log("the guest did not power off after the command: stopped")
                break
            if booted_at is None and now - start > args.boot_timeout:
                log("no boot within %d s (attempt %d)" % (args.boot_timeout, attempt))
                break
            if booted_at is not None and args.timeout and now - booted_at > args.timeout:
                log("the command ran past %d s: stopped" % args.timeout)
                status = 124
                break
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        qemu_out = proc.communicate()[0].decode(errors="replace")
        _running.remove(proc)
        tail.pump()
        end = time.monotonic()
        console = _read(os.path.join(outdir, "console.log"))
        if args.console:
            shutil.copy(os.path.join(outdir, "console.log"), args.console)
        if OOPS.search(console):
            log("kernel log:\n" + "\n".join(console.splitlines()[-60:]))
        if booted_at is None:
            if qemu_out.strip():
                log("qemu: " + qemu_out.strip()[-2000:])
            log("kernel log tail:\n" + "\n".join(console.splitlines()[-25:]))
            return None, end - start, 0.0
        rc_text = _read(os.path.join(outdir, "rc")).strip()
        if status is None:
            status = int(rc_text) if rc_text.isdigit() else 125
            if not rc_text:
                log("the guest ended before the command did")
                log("kernel log tail:\n" + "\n".join(console.splitlines()[-40:]))
        return status, booted_at - start, end - booted_at
    finally:
        if proc is not None and proc.poll() is None:  # (an error here: no guest left behind)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(outdir, ignore_errors=True)
        if args.root != "/":
            try:
                os.rmdir(args.root + outdir)
            except OSError:
                pass


_running: list = []  # the QEMU of the boot under way (its own session: killed by name here)
SHUTDOWN_GRACE = 30  # seconds from the command's end to QEMU's exit (a sysrq reboot: ~1 s)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """(In QEMU's child, before exec) SIGKILL when this script dies, even by SIGKILL: no
    guest outlives its runner."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _stop(signum, frame) -> None:
    """SIGTERM/SIGINT/SIGHUP: take the guest down with us, then exit 128+signal."""
    for proc in _running:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(128 + signum)


def log(message: str) -> None:
    sys.stderr.write("kernel_vm: %s\n" % message)
    sys.stderr.flush()


def main() -> int:
    if sys.argv[1:] == ["--has-static-busybox"]:  # (for kernels.sh)
        return 0 if find_busybox() else 1
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kernel_dir")
    parser.add_argument("--cpus", type=int, default=min(os.cpu_count() or 2, 4))
    parser.add_argument("--memory", default="4G")
    parser.add_argument("--boot-timeout", type=int, default=240)
    parser.add_argument("--timeout", type=int, default=0, help="seconds the command may run")
    parser.add_argument("--attempts", type=int, default=3)
    parser.add_argument("--append", default="", help="more kernel command-line options")
    parser.add_argument("--arch", default="amd64", choices=sorted(MACHINES),
                        help="the kernel's architecture (arm64: qemu-system-aarch64)")
    parser.add_argument("--root", default="/", help="the guest's root file system (default: "
                        "this machine's; another architecture needs its own userland)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="more environment variables for the command")
    parser.add_argument("--console", help="keep the kernel log of the last boot here")
    parser.add_argument("--workdir", help="where each boot's shared folder is made (default: "
                        "beside KERNEL_DIR; not under /tmp, which the guest mounts over)")
    parser.add_argument("--times", help="append 'boot_s run_s status' here")
    argv = sys.argv[1:]
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("usage: kernel_vm.py [OPTIONS] KERNEL_DIR -- CMD...")
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    words = argv[split + 1:]
    # One word: a shell command line; more: an argument vector, quoted for sh -c.
    command = words[0] if len(words) == 1 else shlex.join(words)
    args.kernel_dir = os.path.abspath(args.kernel_dir)
    args.root = os.path.abspath(args.root)
    if not args.workdir:
        args.workdir = os.path.join(os.path.dirname(args.kernel_dir), "runs")
    os.makedirs(args.workdir, exist_ok=True)
    image, release = kernel_image(args.kernel_dir)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stop)
    for attempt in range(1, args.attempts + 1):
        status, boot_s, run_s = boot_once(args, image, release, command, attempt)
        if status is not None:
            log("%s: exit status %d; boot %.1f s, command %.1f s"
                % (release, status, boot_s, run_s))
            if args.times:
                with open(args.times, "a") as f:
                    f.write("%s %.1f %.1f %d\n" % (release, boot_s, run_s, status))
            return status
    log("%s: no boot reached the command in %d attempts" % (release, args.attempts))
    return 125


if __name__ == "__main__":
    sys.exit(main())
