"""The structures of a 64-bit little-endian ELF file read with `struct`: the ELF header,
program and section headers, section names, dynamic entries, strings and notes.

The tracer reads only ELF64 little-endian files (x86-64, AArch64), and of them only these
few tables: reading them here costs a fraction of a millisecond, where importing pyelftools
cost 26-28 ms of every start (docs/performance.md). Callers check what they need of the
values (elf_headers.py validates a file to be traced; the other readers are best effort);
what cannot be read at all raises `RawElfError`, or struct's and the stream's own errors.
"""
from __future__ import annotations
import struct
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

ELF_MAGIC = b"\x7fELF"
ELFCLASS32, ELFCLASS64 = 1, 2
ELFDATA2LSB, ELFDATA2MSB = 1, 2
EHDR_SIZE, PHDR_SIZE, SHDR_SIZE, DYN_SIZE, NHDR_SIZE = 64, 56, 64, 16, 12
PN_XNUM = 0xFFFF  # e_phnum when the count is in section 0's sh_info
SHN_XINDEX = 0xFFFF  # e_shstrndx when the index is in section 0's sh_link
PT_LOAD, PT_DYNAMIC, PT_INTERP, PT_NOTE = 1, 2, 3, 4
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_DYNAMIC, SHT_NOTE, SHT_NOBITS, SHT_DYNSYM = \
    1, 2, 3, 6, 7, 8, 11
DT_NULL, DT_NEEDED, DT_STRTAB, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 14, 15, 29
NT_GNU_BUILD_ID = 3
EM_X86_64 = 62

_EHDR = struct.Struct("<HHIQQQIHHHHHH")  # after e_ident's 16 bytes
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_NHDR = struct.Struct("<III")
_STRING_READ = 256  # bytes read at a time for one string (a soname, a path)


class RawElfError(ValueError):
    """A table that cannot be read (its message says which; no file name)."""


class Header(NamedTuple):
    """Elf64_Ehdr without e_ident."""

    e_type: int
    e_machine: int
    e_version: int
    e_entry: int
    e_phoff: int
    e_shoff: int
    e_flags: int
    e_ehsize: int
    e_phentsize: int
    e_phnum: int
    e_shentsize: int
    e_shnum: int
    e_shstrndx: int


class ProgramHeader(NamedTuple):
    """Elf64_Phdr."""

    p_type: int
    p_flags: int
    p_offset: int
    p_vaddr: int
    p_paddr: int
    p_filesz: int
    p_memsz: int
    p_align: int


class SectionHeader(NamedTuple):
    """Elf64_Shdr."""

    sh_name: int
    sh_type: int
    sh_flags: int
    sh_addr: int
    sh_offset: int
    sh_size: int
    sh_link: int
    sh_info: int
    sh_addralign: int
    sh_entsize: int


def is_elf64_le(ident: bytes) -> bool:
    """Whether `ident` (a file's first bytes) starts a 64-bit little-endian ELF header."""
    return len(ident) >= EHDR_SIZE and ident[:4] == ELF_MAGIC and \
        ident[4] == ELFCLASS64 and ident[5] == ELFDATA2LSB


def parse_header(data: bytes) -> Header:
    """The ELF header of a file whose first EHDR_SIZE bytes are `data`."""
    return Header(*_EHDR.unpack_from(data, 16))


def read_entries(stream, offset: int, entry_size: int, count: int, minimum: int,
                 file_size: int) -> List[bytes]:
    """`count` raw entries of `entry_size` bytes (at least `minimum`) at `offset`, read at
    once after checking that they lie in the file (a damaged count reads nothing)."""
    if not count:
        return []
    if entry_size < minimum or offset + entry_size * count > file_size:
        raise RawElfError("a table of %d entries of %d bytes at %d outside the file"
                          % (count, entry_size, offset))
    stream.seek(offset)
    data = stream.read(entry_size * count)
    if len(data) < entry_size * count:
        raise RawElfError("a table cut short at the end of the file")
    return [data[at:at + minimum] for at in range(0, entry_size * count, entry_size)]


def program_headers(stream, header: Header, count: int, file_size: int) -> List[ProgramHeader]:
    return [ProgramHeader(*_PHDR.unpack(raw)) for raw in read_entries(
        stream, header.e_phoff, header.e_phentsize, count, PHDR_SIZE, file_size)]


def section_headers(stream, header: Header, count: int, file_size: int) -> List[SectionHeader]:
    return [SectionHeader(*_SHDR.unpack(raw)) for raw in read_entries(
        stream, header.e_shoff, header.e_shentsize, count, SHDR_SIZE, file_size)]


def needs_section0(header: Header) -> bool:
    """Whether a count or index is past what the ELF header holds (extended numbering)."""
    return bool(header.e_shoff) and (not header.e_shnum or header.e_phnum == PN_XNUM
                                     or header.e_shstrndx == SHN_XINDEX)


def first_section(stream, header: Header, file_size: int) -> Optional[SectionHeader]:
    """Section 0, which holds the counts that do not fit the ELF header, where needed (else
    None)."""
    if not needs_section0(header):
        return None
    return section_headers(stream, header, 1, file_size)[0]


def section_count(header: Header, section0: Optional[SectionHeader]) -> int:
    """e_shnum, or section 0's sh_size past 0xff00 sections (e_shnum 0); 0 without e_shoff."""
    if not header.e_shoff:
        return 0
    if header.e_shnum or section0 is None:
        return header.e_shnum
    return section0.sh_size


def segment_count(header: Header, section0: Optional[SectionHeader]) -> int:
    """e_phnum, or section 0's sh_info when e_phnum is PN_XNUM."""
    if header.e_phnum != PN_XNUM:
        return header.e_phnum
    if section0 is None:
        raise RawElfError("e_phnum is PN_XNUM but there is no section 0 to hold the count")
    return section0.sh_info


def names_section(header: Header, section0: Optional[SectionHeader]) -> int:
    """The index of the section-name string table (SHN_XINDEX: section 0's sh_link)."""
    if header.e_shstrndx == SHN_XINDEX and section0 is not None:
        return section0.sh_link
    return header.e_shstrndx


def c_string(stream, offset: int, limit: int) -> bytes:
    """The NUL-terminated bytes at `offset`, at most `limit` of them (the table's end)."""
    stream.seek(offset)
    text = b""
    while len(text) < limit:
        more = stream.read(min(_STRING_READ, limit - len(text)))
        if not more:
            break
        end = more.find(b"\0")
        if end >= 0:
            return text + more[:end]
        text += more
    return text


def dynamic_entries(stream, offset: int, size: int, most: int) -> List[Tuple[int, int]]:
    """(d_tag, d_val) of a dynamic table, up to DT_NULL, at most `most` entries and never
    past the table's `size`; RawElfError when the file ends first."""
    count = min(size // DYN_SIZE, most)
    stream.seek(offset)
    data = stream.read(count * DYN_SIZE)
    entries = []
    for tag, value in struct.iter_unpack("<qQ", data[:len(data) // DYN_SIZE * DYN_SIZE]):
        if tag == DT_NULL:
            return entries
        entries.append((tag, value))
    if len(data) < count * DYN_SIZE:
        raise RawElfError("a dynamic table cut short at the end of the file")
    return entries


def notes(stream, offset: int, size: int) -> Iterator[Tuple[bytes, int, bytes]]:
    """(name, n_type, descriptor) of each note of a note section or segment (name and
    descriptor padded to 4 bytes, as the gABI's and pyelftools' reading of ELF64 notes)."""
    end = offset + size
    while offset + NHDR_SIZE < end:
        stream.seek(offset)
        head = stream.read(NHDR_SIZE)
        if len(head) < NHDR_SIZE:
            return
        namesz, descsz, kind = _NHDR.unpack(head)
        offset += NHDR_SIZE
        name = stream.read(min(_round4(namesz), max(0, end - offset))).split(b"\0", 1)[0] \
            if namesz else b""
        offset += _round4(namesz)
        stream.seek(offset)
        desc = stream.read(min(descsz, max(0, end - offset)))
        offset += _round4(descsz)
        yield name, kind, desc


def _round4(value: int) -> int:
    return (value + 3) & ~3


class ElfTables:
    """The ELF header, program and section headers and section names of an ELF64
    little-endian file, for the readers that look sections up by name (kernel
    registrations, the Python interpreter, the loader's _r_debug). Best effort: their
    callers take any exception for a file that names nothing."""

    def __init__(self, stream) -> None:
        self.stream = stream
        stream.seek(0, 2)
        size = stream.tell()
        stream.seek(0)
        ident = stream.read(EHDR_SIZE)
        if not is_elf64_le(ident):
            raise RawElfError("not a 64-bit little-endian ELF file")
        self.header = parse_header(ident)
        section0 = first_section(stream, self.header, size)
        self.segments = program_headers(stream, self.header,
                                        segment_count(self.header, section0), size)
        self.sections = section_headers(stream, self.header,
                                        section_count(self.header, section0), size)
        self._by_name: Dict[str, SectionHeader] = {}
        names = names_section(self.header, section0)
        if 0 < names < len(self.sections):
            table = self.sections[names]
            stream.seek(table.sh_offset)
            raw = stream.read(table.sh_size)
            for section in self.sections:
                end = raw.find(b"\0", section.sh_name)
                name = raw[section.sh_name:end if end >= 0 else len(raw)]
                self._by_name[name.decode("utf-8", "replace")] = section

    def section(self, name: str) -> Optional[SectionHeader]:
        """The section called `name` (the last of that name, as pyelftools' look-up), or
        None."""
        return self._by_name.get(name)

    def data(self, section: SectionHeader) -> bytes:
        """A section's bytes (empty for SHT_NOBITS)."""
        if section.sh_type == SHT_NOBITS:
            return b""
        self.stream.seek(section.sh_offset)
        return self.stream.read(section.sh_size)

    def load_segments(self) -> List[ProgramHeader]:
        return [s for s in self.segments if s.p_type == PT_LOAD]
