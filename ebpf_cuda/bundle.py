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
import sys
import zipfile
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

PACKAGES = ("ebpf_cuda", "elftools", "click")
DISTRIBUTIONS = {"elftools": "pyelftools", "click": "click"}  # whose licenses go along
SHEBANG = b"#!/usr/bin/env python3\n"
CACHE_NAME = "ebpf-cuda"  # the folder under $XDG_CACHE_HOME or ~/.cache

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


def compile_files(paths):
    """Bytecode of each source file of `paths` for this interpreter."""
    import py_compile
    mode = py_compile.PycInvalidationMode.TIMESTAMP  # not SOURCE_DATE_EPOCH's hashed pycs
    for path in paths:
        if path.endswith(".py"):
            try:
                py_compile.compile(path, doraise=True, invalidation_mode=mode)
            except (py_compile.PyCompileError, OSError, ValueError):
                pass  # Python compiles it in memory when it imports it


def in_parallel(work, shares):
    """work(share) for each share, the first in this process and each other in a forked
    child (compiling is CPU-bound, one core each: the first start's figure). Raises OSError
    when a child failed; no child is left running."""
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
        raise OSError("a child unpacking the archive failed")


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


def mark_compiled(folder):
    """The marker file that says this interpreter's bytecode is there."""
    temporary = os.path.join(folder, "%s.%d" % (compiled_marker(), os.getpid()))
    with open(temporary, "w"):
        pass
    os.replace(temporary, os.path.join(folder, compiled_marker()))


def compile_tree(folder):
    """Bytecode of every module under `folder` for this interpreter, then the marker file."""
    if compiled_marker() is None:
        return
    paths = []
    for top, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        paths += [os.path.join(top, name) for name in sorted(files) if name.endswith(".py")]
    if paths:
        in_parallel(compile_files, split(paths, lambda p: os.stat(p).st_size))
    mark_compiled(folder)


def extract(archive, temporary, entries):
    """Write `entries` (names) of `archive` under `temporary`, and compile them."""
    import zipfile
    written = []
    with zipfile.ZipFile(archive) as zipped:
        for name in entries:
            target = os.path.join(temporary, *name.split("/"))
            os.makedirs(os.path.dirname(target), 0o700, exist_ok=True)
            descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(descriptor, "wb") as out:
                out.write(zipped.read(name))
            written.append(target)
    if compiled_marker() is not None:
        compile_files(written)


def unpack(archive, root, final):
    """Unpack `archive` with its bytecode into a private temporary folder in `root` (files
    shared out among forked children, each writing and compiling its own), then rename it
    to `final`; losing the race to a concurrent start is fine."""
    import shutil
    import time
    import zipfile

    temporary = os.path.join(root, ".unpack-%d-%s" % (os.getpid(), os.urandom(6).hex()))
    os.mkdir(temporary, 0o700)
    try:
        with zipfile.ZipFile(archive) as zipped:
            sizes = {}
            for entry in zipped.infolist():
                parts = entry.filename.split("/")
                if entry.is_dir() or entry.filename.startswith("/") or \
                        any(p in ("", ".", "..") for p in parts):
                    continue
                sizes[entry.filename] = entry.file_size
        for folder in {os.path.dirname(name) for name in sizes}:  # (before the children)
            os.makedirs(os.path.join(temporary, *folder.split("/")), 0o700, exist_ok=True)
        in_parallel(lambda share: extract(archive, temporary, share),
                    split(list(sizes), sizes.get))
        if compiled_marker() is not None:
            mark_compiled(temporary)
        try:
            os.rename(temporary, final)
        except OSError:
            if not os.path.isdir(final):
                raise
    finally:
        if os.path.lexists(temporary):
            shutil.rmtree(temporary, ignore_errors=True)
        try:  # leftovers of starts killed while unpacking, an hour old
            for name in os.listdir(root):
                path = os.path.join(root, name)
                if name.startswith(".unpack-") and os.lstat(path).st_mtime < time.time() - 3600:
                    shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def cached_copy(archive):
    """The folder to run from instead of `archive` (unpacked on first use), or None."""
    uid = os.geteuid()
    root = secure_folder(cache_root(), uid)
    if root is None:
        return None
    final = os.path.join(root, archive_hash(archive))
    try:
        info = os.lstat(final)
    except FileNotFoundError:
        unpack(archive, root, final)
        info = os.lstat(final)
    if not trusted(info, uid, True):
        return None
    marker = compiled_marker()
    if marker is not None and not os.path.exists(os.path.join(final, marker)):
        try:
            compile_tree(final)  # another interpreter unpacked it
        except OSError:
            pass
    return final


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
