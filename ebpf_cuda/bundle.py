"""One file to deploy: `python3 -m ebpf_cuda.bundle -o ebpf-cuda.pyz`.

Builds an executable zip application holding ebpf_cuda and its two dependencies, pyelftools
(`elftools`) and click, copied from where this interpreter imports them. It runs with nothing
but python3 (`python3 ebpf-cuda.pyz -- ./app`, or `./ebpf-cuda.pyz -- ./app`), and is
importable as a library too: `sys.path.insert(0, "ebpf-cuda.pyz"); import ebpf_cuda`.
Only pure-Python sources go in (no bytecode: the target's Python compiles what it imports).
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
MAIN = """\
# ebpf-cuda as one file: runs the command line (python3 ebpf-cuda.pyz --help).
from ebpf_cuda.cli import main

main()
"""
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
