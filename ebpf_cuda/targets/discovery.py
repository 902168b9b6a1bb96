"""Which files to probe: mappings of running processes, loader search paths, CUDA toolkit and
Python wheel locations, and executables that carry the CUDA runtime statically.
"""
from __future__ import annotations
import fnmatch
import glob
import os
import site
import struct
import sys
from collections import deque
from typing import Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

from ..errors import ElfError, ProcessError
from .elf import ElfFile, is_elf_for_this_machine, open_elf

# A function only the CUDA runtime defines; an executable defining one carries cudart.
STATIC_CUDART_MARKERS = ("cudaMalloc", "cudaLaunchKernel", "cudaGetDevice")

_TRIPLETS = {"x86_64": ("x86_64-linux-gnu", "x86_64-linux"),
             "aarch64": ("aarch64-linux-gnu", "sbsa-linux")}


class Mapping(NamedTuple):
    """One line of /proc/PID/maps."""

    start: int
    end: int
    perms: str
    offset: int
    dev: str
    inode: int
    path: str  # "" for anonymous memory; may be "[heap]" etc.

    @property
    def is_file(self) -> bool:
        return self.path.startswith("/")


# ---- running processes -------------------------------------------------------------------

def _proc(pid: int, name: str) -> str:
    return "/proc/%d/%s" % (pid, name)


def _check_pid(pid: int) -> None:
    if not isinstance(pid, int) or pid <= 0:
        raise ProcessError("invalid process id %r" % (pid,))


def parse_maps_line(line: str) -> Optional[Mapping]:
    """A `Mapping` from one /proc/PID/maps line (None for a malformed line)."""
    fields = line.rstrip("\n").split(None, 5)
    if len(fields) < 5:
        return None
    try:
        start, end = (int(x, 16) for x in fields[0].split("-"))
        offset, inode = int(fields[2], 16), int(fields[4])
    except ValueError:
        return None
    path = fields[5].strip() if len(fields) > 5 else ""
    if path.endswith(" (deleted)"):
        path = path[: -len(" (deleted)")]
    return Mapping(start, end, fields[1], offset, fields[3], inode, path)


def _why_not_allowed() -> str:
    """What to do about a process whose /proc files this one may not read."""
    if os.geteuid() != 0:
        return "run as root"
    return ("root here lacks CAP_SYS_PTRACE, or the process is in a PID namespace or under "
            "a security module that hides it")


def process_mappings(pid: int) -> List[Mapping]:
    """Every mapping of process `pid`, from /proc/PID/maps."""
    _check_pid(pid)
    try:
        with open(_proc(pid, "maps"), "rb") as stream:  # paths are bytes: any, not UTF-8
            lines = [os.fsdecode(line) for line in stream]
    except FileNotFoundError:
        raise ProcessError("no process with PID %d" % pid) from None
    except PermissionError:
        raise ProcessError("not allowed to inspect process %d (%s)" % (pid, _why_not_allowed())) \
            from None
    except OSError as err:
        raise ProcessError("cannot read the mappings of process %d: %s"
                           % (pid, err.strerror or err)) from None
    if not lines and not os.path.exists(_proc(pid, "exe")):
        raise ProcessError("process %d has exited or is a kernel thread" % pid)
    return [m for m in (parse_maps_line(line) for line in lines) if m is not None]


def process_file_path(pid: int, path: str, inode: int = 0,
                      span: Optional[Tuple[int, int]] = None) -> str:
    """A path that reaches the file `pid` maps at `path` (with `inode`), from our mount
    namespace: the path itself when it is that file; else through /proc/PID/root (a process
    in a container sees other paths); else, given the mapping's `span` (start, end),
    /proc/PID/map_files/START-END, which reaches a file deleted or replaced since."""
    if _is_inode(path, inode):
        return path
    alternative = _proc(pid, "root") + path
    if _is_inode(alternative, inode):
        return alternative
    if span is not None:
        mapped = _proc(pid, "map_files/%x-%x" % span)
        if _is_inode(mapped, inode):
            return mapped
    return alternative if os.path.exists(alternative) else path


def _is_inode(path: str, inode: int) -> bool:
    try:
        return not inode or os.stat(path).st_ino == inode
    except OSError:
        return False


def attach_path(path: str) -> str:
    """The path to attach probes at: the real path, except through /proc (a process's root
    or map_files), which the kernel resolves through that process, and we must not."""
    if path.startswith("/proc/"):
        return path
    return os.path.realpath(path)


def _mapped_files(pid: int) -> List[Mapping]:
    return [m for m in process_mappings(pid) if m.is_file]


def _segment_for_mapping(elf: ElfFile, mapping: Mapping, file_offset: int):
    """The PT_LOAD that `mapping` maps: same page-aligned file offset, holding `file_offset`."""
    page = os.sysconf("SC_PAGE_SIZE")
    aligned = [s for s in elf.segments if s.offset - s.offset % page == mapping.offset]
    holding = [s for s in aligned if s.offset <= file_offset < s.offset + max(s.filesz, 1)]
    if holding or aligned:
        return (holding or aligned)[0]
    for seg in elf.segments:  # unusual layouts: whichever segment holds the offset
        if seg.offset <= file_offset < seg.offset + seg.filesz:
            return seg
    return None


def load_bias(pid: int, path: str) -> int:
    """The amount added to `path`'s virtual addresses in process `pid` (0 for non-PIE)."""
    real = os.path.realpath(path)
    elf = open_elf(real, allow_stripped=True)
    for mapping in _mapped_files(pid):
        if os.path.realpath(process_file_path(pid, mapping.path, mapping.inode)) != real \
                and os.path.realpath(mapping.path) != real:
            continue
        seg = _segment_for_mapping(elf, mapping, mapping.offset)
        if seg is not None:
            page = os.sysconf("SC_PAGE_SIZE")
            return mapping.start - (seg.vaddr - seg.vaddr % page)
    raise ProcessError("process %d has not mapped %s" % (pid, path))


def address_to_file(pid: int, address: int) -> Tuple[str, int]:
    """A run-time address in process `pid` -> (mapped file path, virtual address in that file)."""
    for mapping in _mapped_files(pid):
        if not mapping.start <= address < mapping.end:
            continue
        file_offset = address - mapping.start + mapping.offset
        path = process_file_path(pid, mapping.path, mapping.inode)
        elf = open_elf(path, allow_stripped=True)
        seg = _segment_for_mapping(elf, mapping, file_offset)
        if seg is None:
            raise ElfError("%s: file offset 0x%x lies in no loadable segment"
                           % (path, file_offset))
        return path, file_offset - seg.offset + seg.vaddr
    raise ProcessError("address 0x%x is not in a file mapped by process %d" % (address, pid))


def process_executable(pid: int) -> str:
    """The executable of process `pid` (through /proc/PID/exe, usable across namespaces)."""
    _check_pid(pid)
    link = _proc(pid, "exe")
    try:
        target = os.readlink(link)
    except FileNotFoundError:
        raise ProcessError("no process with PID %d" % pid) from None
    except OSError as err:
        raise ProcessError("cannot inspect process %d: %s" % (pid, err.strerror or err)) \
            from None
    target = target[: -len(" (deleted)")] if target.endswith(" (deleted)") else target
    return target if os.path.exists(target) else link


def libraries_in_process(pid: int, pattern: str = "libcudart.so*",
                         include_static: bool = True) -> List[str]:
    """Files mapped by `pid` whose basename matches `pattern`, plus the process's executable
    when it carries the CUDA runtime statically (`include_static`). Real paths, no duplicates."""
    found: List[str] = []
    seen: Set[Tuple[int, int]] = set()
    for mapping in _mapped_files(pid):
        if fnmatch.fnmatch(os.path.basename(mapping.path), pattern):
            _add_unique(found, seen, process_file_path(pid, mapping.path, mapping.inode,
                                                       (mapping.start, mapping.end)))
    if include_static:
        exe = process_executable(pid)
        if is_static_cudart(exe):
            _add_unique(found, seen, exe)
    return found


def driver_libraries_in_process(pid: int) -> List[str]:
    """The CUDA driver library (libcuda.so*) mapped by `pid`."""
    return libraries_in_process(pid, "libcuda.so*", include_static=False)


# ---- static cudart ---------------------------------------------------------------------

def is_static_cudart(path: str) -> bool:
    """True when `path` defines CUDA runtime functions itself (defined FUNC symbols, local or
    global, in .symtab or .dynsym), as nvcc's default static link does. False for files that
    only import them, and for files that are not readable 64-bit ELF files or are stripped."""
    try:
        return bool(open_elf(path, allow_stripped=True).defines_any(STATIC_CUDART_MARKERS))
    except ElfError:
        return False


# ---- library search --------------------------------------------------------------------

def _triplets() -> Tuple[str, str]:
    return _TRIPLETS.get(os.uname().machine.lower(), ("x86_64-linux-gnu", "x86_64-linux"))


def _split_path_list(value: Optional[str]) -> List[str]:
    return [p for p in (value or "").split(":") if p]


def _cuda_dirs(root: str) -> List[str]:
    target = _triplets()[1]
    return [os.path.join(root, "lib64"), os.path.join(root, "lib"),
            os.path.join(root, "targets", target, "lib")] + \
        sorted(glob.glob(os.path.join(root, "targets", "*", "lib")))


def _toolkit_dirs() -> List[str]:
    dirs: List[str] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            dirs += _cuda_dirs(os.environ[var])
    roots = ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for root in roots:
        dirs += _cuda_dirs(root)
    return dirs


def _site_dirs() -> List[str]:
    dirs = list(sys.path)
    try:
        dirs += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # virtualenv's old site.py lacks these
        pass
    return [d for d in dict.fromkeys(dirs) if d and os.path.isdir(d)]


def _wheel_dirs() -> List[str]:
    """Library folders of NVIDIA's pip wheels (nvidia/<pkg>/lib, nvidia/cu13/lib) and torch."""
    dirs: List[str] = []
    for base in _site_dirs():
        dirs += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib")))
        dirs += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib64")))
        dirs.append(os.path.join(base, "torch", "lib"))
    return dirs


def _system_dirs() -> List[str]:
    triplet = _triplets()[0]
    return ["/usr/lib/" + triplet, "/lib/" + triplet, "/usr/lib64", "/lib64", "/usr/lib",
            "/lib"]


def parse_ld_so_cache(path: str = "/etc/ld.so.cache") -> List[Tuple[str, str]]:
    """(soname, path) pairs of glibc's loader cache (the `glibc-ld.so.cache1.1` format)."""
    try:
        with open(path, "rb") as stream:
            data = stream.read()
    except OSError:
        return []
    magic = b"glibc-ld.so.cache1.1"
    start = data.find(magic)  # after an optional old-format ("ld.so-1.7.0") part
    if start < 0:
        return []
    try:
        nlibs, = struct.unpack_from("<I", data, start + 20)
        entries = []
        for i in range(nlibs):
            _flags, key, value, _osv, _hwcap = struct.unpack_from("<iIIIQ", data,
                                                                  start + 48 + 24 * i)
            entries.append((_c_string(data, start + key), _c_string(data, start + value)))
        return entries
    except (struct.error, ValueError, UnicodeDecodeError):
        return []


def _c_string(data: bytes, offset: int) -> str:
    end = data.index(b"\0", offset)
    return data[offset:end].decode("utf-8")


def ldconfig_entries() -> List[Tuple[str, str]]:
    """(soname, path) pairs from the loader cache; direct parse, else `ldconfig -p`, else []."""
    entries = parse_ld_so_cache()
    if entries:
        return entries
    program = which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig")
                                    else None)
    if program is None:
        return []
    import subprocess  # only when the cache file cannot be read

    try:
        output = subprocess.run([program, "-p"], capture_output=True, text=True, timeout=10,
                                check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_ldconfig_output(output)


def parse_ldconfig_output(text: str) -> List[Tuple[str, str]]:
    """(soname, path) pairs from `ldconfig -p` text."""
    entries = []
    for line in text.splitlines():
        if "=>" not in line:
            continue
        left, path = line.split("=>", 1)
        entries.append((left.strip().split(" ", 1)[0], path.strip()))
    return entries


def _matches(filename: str, name: str) -> bool:
    """`libcudart` matches libcudart.so, libcudart.so.12, libcudart.so.12.4.127."""
    stem = name if ".so" in name else name + ".so"
    return filename == stem or filename.startswith(stem + ".")


def _add_unique(found: List[str], seen: Set[Tuple[int, int]], path: str) -> None:
    try:
        info = os.stat(path)
    except OSError:
        return
    key = (info.st_dev, info.st_ino)
    if key not in seen:
        seen.add(key)
        found.append(attach_path(path))


def _search_dirs(name: str, dirs: Iterable[str], found: List[str],
                 seen: Set[Tuple[int, int]]) -> None:
    for directory in dict.fromkeys(dirs):
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for filename in names:
            path = os.path.join(directory, filename)
            if _matches(filename, name) and os.path.isfile(path) and \
                    is_elf_for_this_machine(path):
                _add_unique(found, seen, path)


def find_library(name: str = "libcudart", extra_paths: Sequence[str] = (),
                 system_dirs: Sequence[str] = ()) -> List[str]:
    """Every copy of library `name` found on this machine, most likely first: `extra_paths`,
    LD_LIBRARY_PATH, CUDA_HOME/CUDA_PATH, Python wheels (nvidia/*/lib, torch/lib), the loader
    cache, /usr/local/cuda*, then the system folders. Real paths, deduplicated by inode;
    only 64-bit ELF files of this machine (no linker scripts, no 32-bit copies)."""
    found: List[str] = []
    seen: Set[Tuple[int, int]] = set()
    dirs = list(extra_paths) + _split_path_list(os.environ.get("LD_LIBRARY_PATH"))
    dirs += [d for var in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(var)
             for d in _cuda_dirs(os.environ[var])]
    dirs += _wheel_dirs()
    _search_dirs(name, dirs, found, seen)
    for soname, path in ldconfig_entries():
        if _matches(soname, name) and is_elf_for_this_machine(path):
            _add_unique(found, seen, path)
    _search_dirs(name, _toolkit_dirs() + list(system_dirs) + _system_dirs(), found, seen)
    return found


def find_driver_library(extra_paths: Sequence[str] = ()) -> List[str]:
    """Every copy of the CUDA driver library (libcuda.so*) found, most likely first
    (also /usr/local/nvidia/lib64 and WSL's /usr/lib/wsl/lib). Toolkit stubs are skipped."""
    extra = ["/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/wsl/lib"]
    found = find_library("libcuda", extra_paths, system_dirs=extra)
    return [p for p in found if "/stubs/" not in p]


# ---- what a command will load ------------------------------------------------------------

def which(program: str) -> Optional[str]:
    """The first executable file named `program` (a bare name) in PATH's folders, found as
    shutil.which finds it. Not shutil's: shutil (with bz2 and lzma) would cost every start
    if imported here, and imported late it may be unreadable by then (a root process that
    drops its privileges and then runs the CLI, which must still say which are missing)."""
    path = os.environ.get("PATH")
    if path is None:  # (unset: the system's default; set but empty: no folder at all)
        try:
            path = os.confstr("CS_PATH")
        except (AttributeError, ValueError):
            path = os.defpath
    for folder in path.split(os.pathsep) if path else ():  # ("" is the current folder)
        candidate = os.path.join(folder, program)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def resolve_executable(program: str) -> Optional[str]:
    """`program` as the shell would find it (PATH search unless it has a slash)."""
    if "/" in program:
        return program if os.path.isfile(program) else None
    return which(program)


def _expand_origin(paths: Iterable[str], origin: str) -> List[str]:
    result = []
    for path in paths:
        for token in ("$ORIGIN", "${ORIGIN}"):
            path = path.replace(token, origin)
        result.append(path)
    return result


def _loader_dirs(elf: ElfFile) -> List[str]:
    """Folders the loader searches for `elf`'s needs: DT_RPATH (without RUNPATH),
    LD_LIBRARY_PATH, DT_RUNPATH, then the default folders (the cache is used by the caller)."""
    origin = os.path.dirname(os.path.realpath(elf.path))
    dirs = [] if elf.runpath else _expand_origin(elf.rpath, origin)
    dirs += _split_path_list(os.environ.get("LD_LIBRARY_PATH"))
    dirs += _expand_origin(elf.runpath, origin)
    return dirs


def _locate_needed(soname: str, dirs: List[str], cache: List[Tuple[str, str]]) -> Optional[str]:
    if "/" in soname:
        return soname if os.path.isfile(soname) else None
    for directory in dirs:
        path = os.path.join(directory, soname)
        if os.path.isfile(path) and is_elf_for_this_machine(path):
            return path
    for name, path in cache:
        if name == soname and is_elf_for_this_machine(path):
            return path
    for directory in _system_dirs():
        path = os.path.join(directory, soname)
        if os.path.isfile(path) and is_elf_for_this_machine(path):
            return path
    return None


def _needed_pairs(path: str, limit: int = 512) -> List[Tuple[str, str]]:
    """(soname, real path) of every shared library `path` loads, breadth first like the
    loader: each library's needs are searched with its own RPATH/RUNPATH."""
    cache = ldconfig_entries()
    result: List[Tuple[str, str]] = []
    seen: Set[str] = set()
    queue = deque([open_elf(path, allow_stripped=True)])
    while queue and len(result) < limit:
        elf = queue.popleft()
        dirs = _loader_dirs(elf)
        for soname in elf.needed:
            if soname in seen:
                continue
            seen.add(soname)
            found = _locate_needed(soname, dirs, cache)
            if found is None:
                continue
            result.append((soname, os.path.realpath(found)))
            try:
                queue.append(open_elf(found, allow_stripped=True))
            except ElfError:
                pass  # unreadable or foreign: its own needs are not followed
    return result


def needed_libraries(path: str) -> List[str]:
    """Real paths of the shared libraries `path` loads (its whole dependency tree)."""
    return [found for _, found in _needed_pairs(path)]


def libraries_for_command(argv: Sequence[str], name: str = "libcudart") -> List[str]:
    """What to probe for a command about to run: its executable when it carries cudart
    statically, else the `name` library its dependency tree loads, else (scripts, programs
    that dlopen it) every copy `find_library` finds."""
    if not argv:
        raise ElfError("no command given")
    exe = resolve_executable(argv[0])
    if exe is None:
        raise ElfError("%s: no such file (not found in PATH either)" % argv[0])
    if name == "libcudart" and is_static_cudart(exe):
        return [os.path.realpath(exe)]
    try:
        needed = _needed_pairs(exe)
    except ElfError:
        needed = []  # a script: the interpreter decides at run time
    matching = [found for soname, found in needed if _matches(soname, name)]
    if matching:
        return list(dict.fromkeys(matching))
    return find_driver_library() if name == "libcuda" else find_library(name)


def driver_library_for_command(argv: Sequence[str]) -> List[str]:
    """The CUDA driver library a command will load (cudart dlopens it, so usually a search)."""
    return libraries_for_command(argv, "libcuda")


# ---- NCCL --------------------------------------------------------------------------------

# Functions only NCCL defines; an executable defining one links NCCL statically.
STATIC_NCCL_MARKERS = ("ncclCommInitRank", "ncclAllReduce", "ncclGetUniqueId")


def nccl_libraries(pid: Optional[int] = None, command: Sequence[str] = ()) -> List[str]:
    """The NCCL files to probe, found as the runtime is: the libnccl.so* process `pid` maps
    (and its executable when it links NCCL statically); for a `command`, its executable when
    it links NCCL statically, else the libnccl its dependency tree loads; else (a script, a
    program that dlopens it, a process that has not loaded it yet, system-wide) every copy
    `find_library` finds: LD_LIBRARY_PATH, CUDA_HOME, NVIDIA's wheels (nvidia/nccl/lib),
    torch/lib, the loader cache, /usr/local/cuda*, the system folders."""
    if pid is not None:
        found = libraries_in_process(pid, "libnccl.so*", include_static=False)
        exe = process_executable(pid)
        if _defines_any(exe, STATIC_NCCL_MARKERS):
            found.append(os.path.realpath(exe))
        if found:
            return found
    elif command:
        exe = resolve_executable(command[0])
        if exe is not None and _defines_any(exe, STATIC_NCCL_MARKERS):
            return [os.path.realpath(exe)]
        return libraries_for_command(command, "libnccl")
    return find_library("libnccl")


def _defines_any(path: str, functions: Sequence[str]) -> bool:
    """True when the ELF file at `path` defines one of `functions` (False when unreadable)."""
    try:
        return bool(open_elf(path, allow_stripped=True).defines_any(functions))
    except ElfError:
        return False
