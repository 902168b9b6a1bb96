"""One file to deploy: `python3 -m ebpf_cuda.bundle -o ebpf-cuda.pyz`.

Builds an executable zip application holding ebpf_cuda and its two dependencies, pyelftools
(`elftools`) and click, copied from where this interpreter imports them. It runs with nothing
but python3 (`python3 ebpf-cuda.pyz -- ./app`, or `./ebpf-cuda.pyz -- ./app`), and is
importable as a library too: `sys.path.insert(0, "ebpf-cuda.pyz"); import ebpf_cuda`.
Only pure-Python sources go in (no bytecode: the target's Python compiles what it imports).

A zip application has no bytecode cache: run from the archive, every start compiles every
module it imports again. So its `__main__` (zipapp.MAIN) unpacks the archive once, on the first
start, into a per-user cache folder named after a hash of the archive's bytes,

    $XDG_CACHE_HOME/ebpf-cuda/<hash>/   (else ~/.cache/ebpf-cuda/<hash>/)

and every start runs from that folder. The first start writes the sources and compiles the
modules that a start imports (HOT_ENTRIES' imports, listed in the archive at build time),
shared out among forked children, one per usable CPU up to 8; every other module is
compiled afterwards by a detached background process at nice 19, which then writes the
marker file (whatever PYTHONDONTWRITEBYTECODE says). The folder is made in a
private temporary folder beside it and renamed into place, so concurrent first starts are
safe (one rename wins, the others use it); bytecode added later is written atomically.
It is used only when it and every folder above it can be changed by nobody but root and the
user running it (owner root or that user, not writable by group or others unless sticky, as
/tmp; symbolic links resolved first): when root runs the file with a HOME or XDG_CACHE_HOME
that another user controls, that user cannot plant code for root to run. When the cache
cannot be used (not writable, not trusted, any error), the file runs from the archive as
before. Deleting the folder is safe, except within the second or so after a first start,
while its background process writes in it (`rm -rf` may then leave part of it, and starts
fail until it is deleted again). Each start holds a shared lock on its folder
(flock, on a close-on-exec descriptor: the traced command never sees it) and touches its
time; after an unpack, the background process removes the folders of other builds beyond
the 4 last used that are unused for an hour and that no running start holds, so that a
trace by an older build keeps its folder (its later imports would fail without it).
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

from .zipapp import FIRST_START_CODE, MAIN

PACKAGES = ("ebpf_cuda", "elftools", "click")
DISTRIBUTIONS = {"elftools": "pyelftools", "click": "click"}  # whose licenses go along
SHEBANG = b"#!/usr/bin/env python3\n"
CACHE_NAME = "ebpf-cuda"  # the folder under $XDG_CACHE_HOME or ~/.cache (zipapp.MAIN's)
# What a trace's start imports: the command line, the tracer, and the modules its start
# imports lazily. Their bytecode is compiled before a first start goes on; every other
# module's in the background (a module missing from this list is only compiled in memory
# when a first start imports it).
HOT_ENTRIES = ("ebpf_cuda.__main__", "ebpf_cuda.cli.main", "ebpf_cuda.tracer",
               "ebpf_cuda.bpf.btf", "ebpf_cuda.output.spool", "ebpf_cuda.output.lines",
               "ebpf_cuda.gpu", "ebpf_cuda.late_loads")
HOT_LIST = ".hot-modules"  # (zipapp.FIRST_START_CODE's name for it)
FIRST_START = "__unpack__.py"  # (zipapp.MAIN's name for it)

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
            archive.writestr(_entry(FIRST_START), FIRST_START_CODE)
            names += ["__main__.py", FIRST_START]
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
