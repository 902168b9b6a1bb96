"""One file to deploy: `python3 -m ebpf_cuda.bundle -o ebpf-cuda.pyz`.

Builds an executable zip application holding ebpf_cuda and its two dependencies, pyelftools
(`elftools`) and click, copied from where this interpreter imports them. It runs with nothing
but python3 (`python3 ebpf-cuda.pyz -- ./app`, or `./ebpf-cuda.pyz -- ./app`), and is
importable as a library too: `sys.path.insert(0, "ebpf-cuda.pyz"); import ebpf_cuda`.
Only pure-Python sources go in (no bytecode: the target's Python compiles what it imports).

A zip application has no bytecode cache: run from the archive, every start compiles every
module it imports again. So its `__main__` (MAIN below) unpacks the archive once, on the first
start, into a per-user cache folder named after a hash of the archive's bytes,

    $XDG_CACHE_HOME/ebpf-cuda/<hash>/   (else ~/.cache/ebpf-cuda/<hash>/)

compiling every module's bytecode there (whatever PYTHONDONTWRITEBYTECODE says; the files
are shared out among forked children, one per usable CPU up to 8, each writing and compiling
its own: compiling is most of a first start), and every start runs from that folder. The folder is made in a private temporary folder beside it and
renamed into place, so concurrent first starts are safe (one rename wins, the others use it).
It is used only when it and every folder above it can be changed by nobody but root and the
user running it (owner root or that user, not writable by group or others unless sticky, as
/tmp; symbolic links resolved first): when root runs the file with a HOME or XDG_CACHE_HOME
that another user controls, that user cannot plant code for root to run. When the cache
cannot be used (not writable, not trusted, any error), the file runs from the archive as
before. Deleting the folder is always safe; old versions' folders are not removed.
"""
import argparse
import importlib.util
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

PACKAGES = ("ebpf_cuda", "elftools", "click")
DISTRIBUTIONS = {"elftools": "pyelftools", "click": "click"}  # whose licenses go along
SHEBANG = b"#!/usr/bin/env python3\n"
CACHE_NAME = "ebpf-cuda"  # the folder under $XDG_CACHE_HOME or ~/.cache
# What a trace's start imports: the command line, the tracer, and the modules its start
# imports lazily. Their bytecode is compiled before a first start goes on; every other
# module's in the background (a module missing from this list is only compiled in memory
# when a first start imports it).
HOT_ENTRIES = ("ebpf_cuda.__main__", "ebpf_cuda.cli.main", "ebpf_cuda.tracer",
               "ebpf_cuda.bpf.btf", "ebpf_cuda.output.spool", "ebpf_cuda.output.lines",
               "ebpf_cuda.gpu", "ebpf_cuda.analysis.memory", "ebpf_cuda.analysis.layers",
               "ebpf_cuda.analysis.python_lines")
HOT_LIST = ".hot-modules"  # (MAIN's name for it)

# The archive's __main__.py: compiled from the archive at every start (no bytecode cache for
# it), so it is short and imports nothing beyond what Python has loaded at start-up (os, sys,
# stat) on the warm path. Python 3.8+ and the standard library only.
MAIN = r'''# ebpf-cuda as one file: runs the command line (python3 ebpf-cuda.pyz --help).
# The first start unpacks the archive, with its modules compiled, into a per-user cache
# folder named after the archive's hash ($XDG_CACHE_HOME/ebpf-cuda/<hash>, else
# ~/.cache/ebpf-cuda/<hash>); every start runs from there when it is safe to, else from the
# archive. Built by `python3 -m ebpf_cuda.bundle` (ebpf_cuda/bundle.py says more).
import os
import stat
import sys

CACHE_NAME = "ebpf-cuda"
HOT_LIST = ".hot-modules"  # the files a start imports, compiled before it goes on
KEEP_OTHERS = 4  # unpacked folders of other builds kept, the last used (upgrades, rollbacks)
IDLE_AGE = 3600  # seconds: a folder used more recently than this is never removed
BACKGROUND = ".background"  # locked by the background work on a folder, while it runs
HELD = []  # the descriptor of this start's folder, locked (see hold())


def archive_path():
    """The zip archive this __main__ runs from, or None (run from a folder, say)."""
    archive = getattr(globals().get("__loader__"), "archive", None)
    return archive if isinstance(archive, str) and os.path.isfile(archive) else None


def archive_hash(archive):
    """Hex digest of the archive's bytes (_blake2 is built in: no OpenSSL to load)."""
    try:
        from _blake2 import blake2b
    except ImportError:
        from hashlib import blake2b
    with open(archive, "rb") as stream:
        return blake2b(stream.read(), digest_size=16).hexdigest()


def cache_root():
    """$XDG_CACHE_HOME/ebpf-cuda (an absolute XDG_CACHE_HOME), else ~/.cache/ebpf-cuda."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        home = os.environ.get("HOME", "")
        if not os.path.isabs(home):
            import pwd
            home = pwd.getpwuid(os.geteuid()).pw_dir
        base = os.path.join(home, ".cache")
    return os.path.join(base, CACHE_NAME)


def trusted(info, uid, last):
    """A real folder (no symbolic link) that only root and `uid` can change: owned by one of
    them, not writable by group or others unless sticky (as /tmp). `last`: the cache's own
    folder, which must be `uid`'s and writable by it alone."""
    if not stat.S_ISDIR(info.st_mode):
        return False
    if last:
        return info.st_uid == uid and not info.st_mode & 0o022
    return info.st_uid in (0, uid) and (not info.st_mode & 0o022 or info.st_mode & stat.S_ISVTX)


def secure_folder(path, uid):
    """The real path of folder `path`, made (0700) where missing, when it and every folder
    above it are trusted; else None. Each folder is checked before anything is made in it."""
    real = os.path.realpath(path)
    parts = [p for p in real.split(os.sep) if p]
    current = os.sep
    if not trusted(os.lstat(current), uid, not parts):
        return None
    for index, part in enumerate(parts):
        current = os.path.join(current, part)
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            try:
                os.mkdir(current, 0o700)
            except FileExistsError:
                pass
            info = os.lstat(current)
        if not trusted(info, uid, index == len(parts) - 1):
            return None
    return real


def compiled_marker():
    """Name of the file that says this interpreter's bytecode was compiled, or None."""
    tag = sys.implementation.cache_tag
    if tag is None:
        return None
    return ".compiled-%s%s" % (tag, ".opt-%d" % sys.flags.optimize if sys.flags.optimize else "")


def compile_files(paths, private=None):
    """Bytecode of each source file of `paths` that has none, for this interpreter: a
    timestamp .pyc as the import system writes it (py_compile itself costs ~12 ms of
    imports). Written atomically, unless `private` is (folder, its final name): a folder
    nobody reads yet, whose code is named after its final place."""
    import marshal
    from importlib.util import MAGIC_NUMBER, cache_from_source
    for path in paths:
        try:
            target = cache_from_source(path)
            if not path.endswith(".py") or os.path.exists(target):
                continue
            shown = path if private is None else private[1] + path[len(private[0]):]
            with open(path, "rb") as stream:
                info = os.fstat(stream.fileno())
                code = compile(stream.read(), shown, "exec", dont_inherit=True)
            header = MAGIC_NUMBER + bytes(4) + (int(info.st_mtime) & 0xFFFFFFFF).to_bytes(
                4, "little") + (info.st_size & 0xFFFFFFFF).to_bytes(4, "little")
            os.makedirs(os.path.dirname(target), 0o700, exist_ok=True)
            temporary = target if private else "%s.%d" % (target, os.getpid())
            with open(temporary, "wb") as out:
                out.write(header + marshal.dumps(code))
            if temporary != target:
                os.replace(temporary, target)
        except (SyntaxError, ValueError, OSError):
            pass  # Python compiles it in memory when it imports it


def in_parallel(work, shares):
    """work(share) for each share, the first in this process and each other in a forked
    child (compiling is CPU-bound, one core each). Raises OSError when a child failed; no
    child is left running."""
    children = []
    try:
        for share in shares[1:]:
            pid = os.fork()
            if pid == 0:
                status = 1
                try:
                    work(share)
                    status = 0
                finally:
                    os._exit(status)
            children.append(pid)
        work(shares[0])
    except BaseException:
        for pid in children:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        for pid in children:
            os.waitpid(pid, 0)
        raise
    if any([os.waitpid(pid, 0)[1] for pid in children]):  # (every child reaped)
        raise OSError("a child compiling the archive's modules failed")


def split(items, weight):
    """`items` dealt into one share per usable CPU (at most 8), heaviest first."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    shares = [[] for _ in range(max(1, min(cpus, 8, len(items))))]
    loads = [0] * len(shares)
    for item in sorted(items, key=weight, reverse=True):
        least = loads.index(min(loads))
        shares[least].append(item)
        loads[least] += weight(item)
    return shares


def hot_files(folder):
    """Paths of the sources a start imports (the archive's HOT_LIST) under `folder`."""
    try:
        with open(os.path.join(folder, HOT_LIST)) as listing:
            return {os.path.join(folder, *name.split("/")) for name in listing.read().split()}
    except OSError:
        return set()


def compile_hot(folder):
    """Bytecode of the modules a start imports, shared out among forked children."""
    paths = [path for path in hot_files(folder) if os.path.isfile(path)]
    if paths:
        in_parallel(compile_files, split(paths, lambda p: os.stat(p).st_size))


def mark_compiled(folder):
    """The marker file that says this interpreter's bytecode is there."""
    temporary = os.path.join(folder, "%s.%d" % (compiled_marker(), os.getpid()))
    with open(temporary, "w"):
        pass
    os.replace(temporary, os.path.join(folder, compiled_marker()))


def compile_tree(folder):
    """Bytecode of every module under `folder` for this interpreter, then the marker file."""
    paths = []
    for top, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        paths += [os.path.join(top, name) for name in sorted(files) if name.endswith(".py")]
    compile_files(paths)
    mark_compiled(folder)


def in_background(folder, work):
    """work() in a detached grandchild (its own session, output to /dev/null, the idle
    scheduling class: it takes no CPU that the tool or the traced command wants), while
    this start goes on; the child between is reaped at once. Not when one runs already:
    it holds the lock of `folder`'s BACKGROUND file until it ends."""
    import fcntl
    handle = os.open(os.path.join(folder, BACKGROUND), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o600)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        pid = os.fork()
    except OSError:  # (BlockingIOError: one runs)
        os.close(handle)
        return
    if pid:
        os.close(handle)  # (the grandchild's copy keeps the lock)
        os.waitpid(pid, 0)
        return
    try:
        if os.fork() == 0:
            os.setsid()
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            except (AttributeError, OSError):
                os.nice(19)
            null = os.open(os.devnull, os.O_RDWR)
            for descriptor in (0, 1, 2):
                os.dup2(null, descriptor)
            work()
    finally:
        os._exit(0)


def unpacked_folder(root, name, uid):
    """The time of last use of `name` in `root` when it is the unpacked folder of a build (a
    hash: a real folder of `uid` holding a __main__.py), else None."""
    if len(name) != 32 or name.strip("0123456789abcdef"):
        return None
    info = os.lstat(os.path.join(root, name))
    if stat.S_ISDIR(info.st_mode) and info.st_uid == uid and \
            os.path.isfile(os.path.join(root, name, "__main__.py")):
        return info.st_mtime  # (a start touches its folder)
    return None


def remove_unless_used(root, folder):
    """Remove `folder` unless a running start holds it (a shared lock, see hold()): locked
    exclusively, renamed away (a start opening it now unpacks afresh), then deleted."""
    import fcntl
    import shutil
    handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: in use
        doomed = os.path.join(root, ".unpack-old-%d-%s" % (os.getpid(), os.urandom(6).hex()))
        os.rename(folder, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    finally:
        os.close(handle)


def prune(root, kept):
    """Remove the folders of other builds beyond the KEEP_OTHERS last used, those unused
    for IDLE_AGE and held by no running start, and the leftovers of starts killed while
    unpacking (an hour old)."""
    import shutil
    import time
    uid, now = os.geteuid(), time.time()
    others = []
    for name in os.listdir(root):
        try:
            path = os.path.join(root, name)
            if name.startswith(".unpack-"):
                if os.lstat(path).st_mtime < now - 3600:
                    shutil.rmtree(path, ignore_errors=True)
            elif name != kept:
                used = unpacked_folder(root, name, uid)
                if used is not None:
                    others.append((used, path))
        except OSError:
            pass
    for used, path in sorted(others, reverse=True)[KEEP_OTHERS:]:
        try:
            if used < now - IDLE_AGE:
                remove_unless_used(root, path)
        except OSError:
            pass


def extract(archive, temporary, final, names):
    """Write `names` of `archive` under the private folder `temporary`, and compile those
    a start imports (creating a file costs ~0.3 ms on some hosts: no more are written)."""
    import zipfile
    written = []
    with zipfile.ZipFile(archive) as zipped:
        for name in names:
            target = os.path.join(temporary, *name.split("/"))
            descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(descriptor, "wb") as out:
                out.write(zipped.read(name))
            written.append(target)
    if compiled_marker() is not None:
        hot = hot_files(temporary)
        compile_files([path for path in written if path in hot], (temporary, final))


def unpack(archive, root, final):
    """The archive's sources written into a private temporary folder in `root`, the
    modules a start imports compiled there (files shared out among forked children), then
    renamed to `final` (losing the race to a concurrent start is fine)."""
    import zipfile

    temporary = os.path.join(root, ".unpack-%d-%s" % (os.getpid(), os.urandom(6).hex()))
    os.mkdir(temporary, 0o700)
    try:
        with zipfile.ZipFile(archive) as zipped:
            sizes = {}
            for entry in zipped.infolist():
                parts = entry.filename.split("/")
                if not entry.is_dir() and not entry.filename.startswith("/") and \
                        not any(p in ("", ".", "..") for p in parts):
                    sizes[entry.filename] = entry.file_size
            if HOT_LIST in sizes:  # (before the children: they read it)
                extract(archive, temporary, final, [HOT_LIST])
                del sizes[HOT_LIST]
        for folder in {os.path.dirname(name) for name in sizes}:
            os.makedirs(os.path.join(temporary, *folder.split("/")), 0o700, exist_ok=True)
        in_parallel(lambda share: extract(archive, temporary, final, share),
                    split(list(sizes), sizes.get))
        try:
            os.rename(temporary, final)
        except OSError:
            if not os.path.isdir(final):
                raise
    finally:
        if os.path.lexists(temporary):
            import shutil
            shutil.rmtree(temporary, ignore_errors=True)


def hold(final, uid):
    """An open descriptor of folder `final`, shared-locked for as long as this process runs
    (prune() removes no folder that a start holds) and its time of use touched; None when
    it is not trusted or is being removed."""
    import fcntl
    handle = os.open(final, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(handle)
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        now = os.lstat(final)  # (not renamed away before the lock was ours)
        if trusted(info, uid, True) and (now.st_ino, now.st_dev) == (info.st_ino, info.st_dev):
            os.utime(handle)
            HELD.append(handle)
            return handle
    except BlockingIOError:
        pass
    os.close(handle)
    return None


def cached_copy(archive):
    """The folder to run from instead of `archive` (unpacked on first use), or None. A
    first start unpacks the sources and compiles what a start imports; the rest is
    compiled (and old builds' folders pruned) in the background."""
    uid = os.geteuid()
    root = secure_folder(cache_root(), uid)
    if root is None:
        return None
    final = os.path.join(root, archive_hash(archive))
    fresh = not os.path.lexists(final)
    if fresh:
        unpack(archive, root, final)
    if hold(final, uid) is None:
        return None
    marker = compiled_marker()
    if marker is not None and not os.path.exists(os.path.join(final, marker)):
        if not fresh:  # (an unpack compiled them): unpacked by another interpreter
            compile_hot(final)
        in_background(final, lambda: finish(root, final, fresh))
    elif fresh:
        in_background(final, lambda: prune(root, os.path.basename(final)))
    return final


def finish(root, final, fresh):
    """The background part of a first start: every other module's bytecode, the marker,
    then (after an unpack) the folders of other builds pruned."""
    compile_tree(final)
    if fresh:
        prune(root, os.path.basename(final))


def run_from_cache():
    """Put the cached copy in the archive's place on sys.path, when there is one."""
    archive = archive_path()
    if archive is None:
        return
    try:
        folder = cached_copy(archive)
    except Exception:  # never keep the tool from running: run from the archive
        folder = None
    if folder is None:
        return
    if sys.path and os.path.abspath(sys.path[0]) == os.path.abspath(archive):
        sys.path[0] = folder
    else:
        sys.path.insert(0, folder)


if __name__ == "__main__":
    try:
        run_from_cache()
    except KeyboardInterrupt:  # while unpacking, on the first start
        sys.stderr.write("ebpf-cuda: interrupted by SIGINT while starting\n")
        sys.exit(130)
    # As `python3 -m ebpf_cuda` starts (its stop signals handled before the CLI's imports).
    try:
        from ebpf_cuda.__main__ import run
    except ImportError:
        from ebpf_cuda.cli.main import main as run
    run()
'''
_SKIPPED_DIRS = {"__pycache__"}
_KEPT_SUFFIXES = {".py", ".typed"}  # sources and py.typed markers


def package_dir(name: str) -> Path:
    """The folder a package is imported from (ImportError when it is not installed, or is
    not a plain folder of sources)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("package %s is not installed (pip install %s)"
                          % (name, "pyelftools" if name == "elftools" else name))
    folder = Path(list(spec.submodule_search_locations)[0])
    if not folder.is_dir():
        raise ImportError("package %s is not a folder of sources (%s)" % (name, folder))
    return folder


def package_files(name: str) -> Iterator[Tuple[Path, str]]:
    """(file on disk, name in the archive) of each source file of a package, sorted."""
    root = package_dir(name)
    for folder, dirs, files in os.walk(str(root)):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
        for file in sorted(files):
            path = Path(folder) / file
            if path.suffix in _KEPT_SUFFIXES:
                yield path, "%s/%s" % (name, path.relative_to(root).as_posix())


def license_files(package: str) -> Iterator[Tuple[bytes, str]]:
    """(text, name in the archive) of the license files of a dependency's distribution:
    both are BSD-licensed, which asks that copies carry the license."""
    from importlib import metadata

    dist_name = DISTRIBUTIONS.get(package)
    if dist_name is None:
        return
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return
    for file in dist.files or ():
        if "LICENSE" in file.name.upper() or "COPYING" in file.name.upper():
            yield Path(str(file.locate())).read_bytes(), "licenses/%s/%s" % (dist_name, file.name)


def hot_files(packages: Sequence[str] = PACKAGES) -> List[str]:
    """Archive names of the sources that importing HOT_ENTRIES loads, in import order (a
    child interpreter imports them from where this one finds the packages)."""
    roots = {package: package_dir(package) for package in packages}
    folders = sorted({str(root.parent) for root in roots.values()})
    code = ("import sys; sys.path[:0] = %r; before = set(sys.modules)\n"
            "for name in %r:\n    __import__(name)\n"
            "print('\\n'.join(getattr(m, '__file__', None) or '' for n, m in "
            "list(sys.modules.items()) if n not in before))" % (folders, HOT_ENTRIES))
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        raise ImportError("importing the modules of a start failed: %s"
                          % (done.stderr.strip().splitlines() or ["?"])[-1])
    names = []
    for line in done.stdout.split():
        for package, root in roots.items():
            path = Path(line)
            if path.suffix == ".py" and root in path.parents:
                names.append("%s/%s" % (package, path.relative_to(root).as_posix()))
    return names


def build(output: str, packages: Sequence[str] = PACKAGES) -> List[str]:
    """Write the zip application to `output` (made executable); the archive's names."""
    names = []
    tmp = output + ".tmp"
    with open(tmp, "wb") as raw:
        raw.write(SHEBANG)
        with zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(_entry("__main__.py"), MAIN)
            names.append("__main__.py")
            for package in packages:
                for path, arcname in package_files(package):
                    archive.writestr(_entry(arcname), path.read_bytes())
                    names.append(arcname)
                for text, arcname in license_files(package):
                    archive.writestr(_entry(arcname), text)
                    names.append(arcname)
            archive.writestr(_entry(HOT_LIST), "".join(n + "\n" for n in hot_files(packages)))
            names.append(HOT_LIST)
    os.chmod(tmp, os.stat(tmp).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.replace(tmp, output)
    return names


def _entry(name: str) -> zipfile.ZipInfo:
    """A fixed-date, world-readable entry, so that two builds of the same sources match."""
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    return info


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m ebpf_cuda.bundle",
                                     description="Build ebpf-cuda as one executable file.")
    parser.add_argument("-o", "--output", default="ebpf-cuda.pyz",
                        help="the file to write (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        names = build(args.output)
    except (ImportError, OSError) as err:
        print("ebpf_cuda.bundle: %s" % err, file=sys.stderr)
        return 1
    print("%s: %d files, %d bytes; run it with: python3 %s --help"
          % (args.output, len(names), os.path.getsize(args.output), args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
