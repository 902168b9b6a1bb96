"""Which dynamic loader to watch: the PT_INTERP of a program (or of its script's
interpreter), the loader a running process maps (auxv AT_BASE), and where _r_debug lies in a
loader file (for the loader program's attach cookie, probes/loader.py).
"""
import os
import struct
from typing import List, Optional, Sequence

from ..errors import ProcessError
from . import discovery, elf_raw, procfs
from .elf_symbols import SYM_FORMAT, SYM_SIZE

PT_INTERP = 3


def interpreter_of(path: str, depth: int = 0) -> Optional[str]:
    """The PT_INTERP of the ELF file at `path` (its dynamic loader), the loader of a
    script's `#!` interpreter (scripts run by scripts: 4 deep at most, as the kernel), or
    None (a static executable, not readable)."""
    try:
        with open(path, "rb") as stream:
            head = stream.read(64)
            if head.startswith(b"#!"):
                stream.seek(0)
                words = stream.readline(256)[2:].split()
                program = discovery.resolve_executable(os.fsdecode(words[0])) if words else None
                return (interpreter_of(program, depth + 1)
                        if program and depth < 4 else None)
            if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            stream.seek(phoff)
            table = stream.read(phentsize * phnum)
            for i in range(phnum):
                p_type, _, p_offset, _, _, p_filesz = struct.unpack_from(
                    "<IIQQQQ", table, i * phentsize)
                if p_type == PT_INTERP:
                    stream.seek(p_offset)
                    return os.fsdecode(stream.read(p_filesz).split(b"\0", 1)[0]) or None
    except (OSError, struct.error, IndexError):
        return None
    return None


def own_loader() -> Optional[str]:
    """The dynamic loader this process runs with (the machine's usual one)."""
    return process_loader(os.getpid(), own=True)


def process_loader(pid: int, own: bool = False) -> Optional[str]:
    """A path that reaches the dynamic loader process `pid` maps (from its auxv AT_BASE:
    the loader's first mapping), or None for a static executable."""
    base = procfs.at_base(pid)
    if not base:
        return None
    try:
        for m in discovery.process_mappings(pid):
            if m.start == base and m.is_file:
                return m.path if own else discovery.process_file_path(
                    pid, m.path, m.inode, (m.start, m.end))
    except (OSError, ProcessError):
        return None
    return None


def r_debug_distance(loader: str, hook_vaddr: int) -> int:
    """_r_debug's address minus _dl_debug_state's in the loader file (0 when it has none:
    then the program tells of every call)."""
    try:
        with open(loader, "rb") as stream:
            value = dynamic_symbol_value(elf_raw.ElfTables(stream), "_r_debug")
    except Exception:  # struct's, elf_raw's, I/O: a file that is no ELF after all
        return 0
    return value - hook_vaddr if value else 0


def dynamic_symbol_value(tables: elf_raw.ElfTables, name: str) -> Optional[int]:
    """st_value of the first .dynsym symbol `name` whose value is not 0 (a loader's .dynsym
    is a few dozen symbols: read whole)."""
    dynsym = tables.section(".dynsym")
    if dynsym is None or dynsym.sh_entsize != SYM_SIZE or \
            not 0 < dynsym.sh_link < len(tables.sections):
        return None
    strings = tables.data(tables.sections[dynsym.sh_link])
    symbols = tables.data(dynsym)
    wanted = name.encode() + b"\0"
    for st_name, _info, _other, _shndx, value, _size in struct.iter_unpack(
            SYM_FORMAT, symbols[:len(symbols) // SYM_SIZE * SYM_SIZE]):
        if value and strings.startswith(wanted, st_name):
            return value
    return None


def loaders_for(pid: Optional[int], command: Sequence[str]) -> List[str]:
    """The loader files to watch: process `pid`'s, or the command's interpreter (or its
    script's) and this process's own (a command that runs another program through a
    shell or env still uses the machine's usual loader)."""
    found: List[str] = []
    if pid is not None:
        found.append(process_loader(pid) or "")
    else:
        exe = discovery.resolve_executable(command[0]) if command else None
        found.append((interpreter_of(exe) if exe else None) or "")
        found.append(own_loader() or "")
    return [path for path in dict.fromkeys(found) if path]
