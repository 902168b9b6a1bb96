"""The structure of an ELF file: ELF header, program headers, section headers, dynamic tags
such as DT_NEEDED/DT_RPATH/DT_RUNPATH/DT_SONAME, notes such as the GNU build id.
`ElfHeaders` is what `elf.ElfFile` builds on (it adds the symbols).

Read with `struct` (elf_raw.py), header by header: only the tables the tracer uses, in a
fraction of a millisecond. pyelftools did this until 2026-12-07; its import alone was 26-28 ms
of every start (docs/performance.md), and the tests still check these answers against it.
"""
import errno
import os
import stat
import struct
from typing import List, NamedTuple, Optional, Tuple

from ..errors import ElfError
from . import elf_raw
from .elf_raw import (EHDR_SIZE, ELF_MAGIC, ELFCLASS64, ELFDATA2LSB,  # noqa: F401
                      PHDR_SIZE, SHDR_SIZE, SectionHeader)
from .elf_symbols import SYM_SIZE, SymbolSection

ET_EXEC, ET_DYN = 2, 3
MAX_DYNAMIC_TAGS = 65536  # a damaged table without DT_NULL is not read to the end of the file
_STRING_TAGS = {elf_raw.DT_NEEDED: "needed", elf_raw.DT_SONAME: "soname",
                elf_raw.DT_RPATH: "rpath", elf_raw.DT_RUNPATH: "runpath"}
_TAG_NAMES = {elf_raw.DT_NEEDED: "DT_NEEDED", elf_raw.DT_SONAME: "DT_SONAME",
              elf_raw.DT_RPATH: "DT_RPATH", elf_raw.DT_RUNPATH: "DT_RUNPATH"}

# e_machine values by `os.uname().machine` name.
MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183}
MACHINE_NAMES = {3: "x86 (i386)", 8: "MIPS", 20: "PowerPC", 21: "PowerPC64", 40: "ARM",
                 62: "x86-64", 183: "AArch64", 243: "RISC-V"}
TYPE_NAMES = {0: "an ELF file of no type", 1: "a relocatable object", 4: "a core dump"}


class Segment(NamedTuple):
    """A PT_LOAD program header."""

    vaddr: int
    offset: int
    filesz: int
    memsz: int
    flags: int


def running_machine() -> int:
    """The e_machine value of the machine this process runs on."""
    machine = os.uname().machine.lower()
    if machine not in MACHINES:
        raise ElfError("unsupported architecture %r" % machine)
    return MACHINES[machine]


class ElfHeaders:
    """The headers of a validated 64-bit ELF executable or shared library of the running
    architecture, read when the object is made: segments, symbol-table sections, dynamic
    tags; the build id on first use."""

    def __init__(self, path: str, machine: Optional[int] = None) -> None:
        self.path = str(path)
        self._expected_machine = running_machine() if machine is None else machine
        self.size = self._check_path()
        self.machine = 0
        self.elf_type = 0
        self.entry = 0
        self.segments: List[Segment] = []
        self.needed: List[str] = []
        self.runpath: List[str] = []
        self.rpath: List[str] = []
        self.soname: Optional[str] = None
        self._symbol_sections: List[SymbolSection] = []
        self._build_id: Optional[str] = None
        self._notes: List[Tuple[int, int]] = []  # (file offset, size) of each note table
        self._read_headers()

    # ---- validation -------------------------------------------------------------------

    def _check_path(self) -> int:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            raise ElfError("%s: no such file" % self.path) from None
        except OSError as err:
            raise ElfError("%s: cannot read: %s" % (self.path, err.strerror or err)) from None
        if stat.S_ISDIR(info.st_mode):
            raise ElfError("%s is a directory, not an ELF file" % self.path)
        if not stat.S_ISREG(info.st_mode):
            raise ElfError("%s is not a regular file" % self.path)
        return info.st_size

    def _check_ident(self, header: bytes) -> None:
        """Not ELF at all, cut inside its header, of a class or byte order that no ELF has."""
        if header[:4] != ELF_MAGIC:
            raise ElfError("%s is not an ELF file" % self.path)
        if len(header) < EHDR_SIZE:
            raise ElfError("%s is truncated (%d bytes, shorter than an ELF header)"
                           % (self.path, len(header)))
        if header[4] not in (1, ELFCLASS64):
            raise ElfError("%s is an ELF file of unknown class %d; only 64-bit ELF files can be "
                           "traced" % (self.path, header[4]))
        if header[5] not in (ELFDATA2LSB, 2):
            raise ElfError("%s is an ELF file of unknown byte order %d" % (self.path, header[5]))

    def _check_identity(self, ident: bytes, header: elf_raw.Header) -> None:
        """64-bit, little-endian, this machine, an executable or shared library."""
        if ident[4] != ELFCLASS64:
            raise ElfError("%s is a 32-bit (ELFCLASS32) ELF file; only 64-bit ELF files can be "
                           "traced" % self.path)
        if ident[5] != ELFDATA2LSB:
            raise ElfError("%s is a big-endian ELF file; only little-endian is supported"
                           % self.path)
        self.machine, self.elf_type = header.e_machine, header.e_type
        if self.machine != self._expected_machine:
            raise ElfError("%s is built for %s (e_machine %d), not for this machine (%s)"
                           % (self.path, MACHINE_NAMES.get(self.machine, "another machine"),
                              self.machine, MACHINE_NAMES.get(self._expected_machine, "?")))
        if self.elf_type not in (ET_EXEC, ET_DYN):
            raise ElfError("%s is %s, not an executable or shared library"
                           % (self.path, TYPE_NAMES.get(self.elf_type, "of ELF type %d"
                                                        % self.elf_type)))

    def _check_table(self, offset: int, entry_size: int, count: int, minimum: int,
                     what: str) -> None:
        if count and entry_size < minimum:
            raise ElfError("%s is a corrupted ELF file (%s entries of %d bytes, fewer than %d)"
                           % (self.path, what, entry_size, minimum))
        if count and offset + entry_size * count > self.size:
            raise ElfError("%s is truncated (its %s table runs past the end of the %d-byte "
                           "file)" % (self.path, what, self.size))

    def _read_headers(self) -> None:
        try:
            with open(self.path, "rb") as stream:
                ident = stream.read(EHDR_SIZE)
                self._check_ident(ident)
                self._parse(stream, ident)
        except ElfError:
            raise
        except OSError as err:
            raise self._read_error(err, "is a corrupted ELF file") from None
        except Exception as err:  # struct's errors, elf_raw's, offsets no seek can reach
            raise ElfError("%s is a corrupted ELF file (%s)"
                           % (self.path, describe_error(err))) from None

    def _read_error(self, err: OSError, corrupted: str) -> ElfError:
        if err.errno in (errno.EINVAL, errno.EOVERFLOW):  # a seek to a corrupted offset
            return ElfError("%s %s (an offset past any file's end)" % (self.path, corrupted))
        return ElfError("%s: cannot read: %s" % (self.path, err.strerror or err))

    def _parse(self, stream, ident: bytes) -> None:
        """Segments, symbol tables, dynamic tags and where the notes are, each table checked
        to lie in the file before it is read."""
        header = elf_raw.parse_header(ident)
        self._check_identity(ident, header)
        self.entry = header.e_entry
        section0 = None
        if elf_raw.needs_section0(header):  # (extended numbering: counts in section 0)
            self._check_table(header.e_shoff, header.e_shentsize, 1, SHDR_SIZE,
                              "section header")
            section0 = elf_raw.first_section(stream, header, self.size)
        sections = elf_raw.section_count(header, section0)
        self._check_table(header.e_shoff, header.e_shentsize, sections, SHDR_SIZE,
                          "section header")
        segments = elf_raw.segment_count(header, section0)
        self._check_table(header.e_phoff, header.e_phentsize, segments, PHDR_SIZE,
                          "program header")
        names = elf_raw.names_section(header, section0)
        if sections and names >= sections:
            raise ElfError("%s is a corrupted ELF file (its section names would be in section "
                           "%d of %d)" % (self.path, names, sections))
        dynamic_segment, notes = None, []
        for program in elf_raw.program_headers(stream, header, segments, self.size):
            if program.p_type == elf_raw.PT_LOAD:
                self.segments.append(Segment(program.p_vaddr, program.p_offset,
                                             program.p_filesz, program.p_memsz,
                                             program.p_flags))
            elif program.p_type == elf_raw.PT_DYNAMIC and dynamic_segment is None:
                dynamic_segment = program
            elif program.p_type == elf_raw.PT_NOTE:
                notes.append((program.p_offset, program.p_filesz))
        headers = elf_raw.section_headers(stream, header, sections, self.size)
        self._notes = [(s.sh_offset, s.sh_size) for s in headers
                       if s.sh_type == elf_raw.SHT_NOTE] or notes  # (no sections: PT_NOTE)
        self._read_sections(stream, headers)
        if not sections and dynamic_segment is not None:
            self._read_dynamic_segment(stream, dynamic_segment)

    def _read_sections(self, stream, headers: List[SectionHeader]) -> None:
        """The symbol tables' places; the dynamic sections' tags."""
        dynamic_sections = []
        for header in headers:
            if header.sh_type in (elf_raw.SHT_SYMTAB, elf_raw.SHT_DYNSYM):
                self._add_symbol_section(header, headers)
            elif header.sh_type == elf_raw.SHT_DYNAMIC:
                dynamic_sections.append(header)
        for header in dynamic_sections:
            strtab = self._linked_strings(header, headers, "dynamic section")
            if strtab.sh_type != elf_raw.SHT_STRTAB:
                raise ElfError("%s: its dynamic section links to no string table" % self.path)
            entries = elf_raw.dynamic_entries(stream, header.sh_offset, header.sh_size,
                                              MAX_DYNAMIC_TAGS)
            self._take_tags(stream, entries, strtab.sh_offset, strtab.sh_size)

    def _read_dynamic_segment(self, stream, segment: elf_raw.ProgramHeader) -> None:
        """No section table (stripped of it): the loader reads PT_DYNAMIC, so do we, with
        the strings where DT_STRTAB's address lies in the file. Best effort: a damaged one
        leaves the file without known dependencies."""
        try:
            entries = elf_raw.dynamic_entries(stream, segment.p_offset, segment.p_filesz,
                                              MAX_DYNAMIC_TAGS)
            address = next((value for tag, value in entries if tag == elf_raw.DT_STRTAB), None)
            strings = None if address is None else next(
                (address - s.vaddr + s.offset for s in self.segments
                 if s.vaddr <= address < s.vaddr + s.filesz), None)
            if strings is not None:
                self._take_tags(stream, entries, strings, None)
                return
        except Exception:  # struct's, elf_raw's, seek errors
            pass
        self.needed, self.soname, self.rpath, self.runpath = [], None, [], []

    def _section_bytes_in_file(self, header: SectionHeader, what: str) -> None:
        if header.sh_type != elf_raw.SHT_NOBITS and \
                header.sh_offset + header.sh_size > self.size:
            raise ElfError("%s is truncated (its %s runs past the end of the file)"
                           % (self.path, what))

    def _linked_strings(self, header: SectionHeader, headers: List[SectionHeader],
                        what: str) -> SectionHeader:
        link = header.sh_link
        if not 0 < link < len(headers):
            raise ElfError("%s: its %s links to no string table" % (self.path, what))
        strtab = headers[link]
        self._section_bytes_in_file(header, what)
        self._section_bytes_in_file(strtab, "string table of its " + what)
        return strtab

    def _add_symbol_section(self, header: SectionHeader, headers: List[SectionHeader]) -> None:
        kind = ".symtab" if header.sh_type == elf_raw.SHT_SYMTAB else ".dynsym"
        strtab = self._linked_strings(header, headers, kind)
        self._symbol_sections.append(SymbolSection(
            kind, header.sh_offset, header.sh_size, header.sh_entsize or SYM_SIZE,
            strtab.sh_offset, strtab.sh_size))

    def _take_tags(self, stream, entries: List[Tuple[int, int]], strings: int,
                   strings_size: Optional[int]) -> None:
        """DT_NEEDED, DT_SONAME, DT_RPATH and DT_RUNPATH of a dynamic table's entries, their
        strings read at `strings` (a table of `strings_size` bytes; None: up to the file's
        end, for PT_DYNAMIC without sections)."""
        for tag, value in entries:
            field = _STRING_TAGS.get(tag)
            if field is None:
                continue
            if strings_size is not None and not value < strings_size:
                raise ElfError("%s: string offset %d of its %s lies outside its string table"
                               % (self.path, value, _TAG_NAMES[tag]))
            limit = (strings_size if strings_size is not None else self.size - strings) - value
            text = elf_raw.c_string(stream, strings + value, max(0, limit)).decode(
                "utf-8", "replace")
            if tag == elf_raw.DT_NEEDED:
                self.needed.append(text)
            elif tag == elf_raw.DT_SONAME:
                self.soname = text
            else:
                paths = self.rpath if tag == elf_raw.DT_RPATH else self.runpath
                paths.extend(p for p in text.split(":") if p)

    @property
    def build_id(self) -> Optional[str]:
        """The GNU build id (NT_GNU_BUILD_ID note) in hex, or None; read on first use."""
        if self._build_id is None:
            self._build_id = self._read_build_id() or ""
        return self._build_id or None

    def _read_build_id(self) -> Optional[str]:
        """From the SHT_NOTE sections (or, without a section table, the PT_NOTE segments)."""
        try:
            with open(self.path, "rb") as stream:
                for offset, size in self._notes:  # (a damaged size: up to the file's end)
                    for name, kind, desc in elf_raw.notes(stream, offset,
                                                          min(size, self.size - offset)):
                        if kind == elf_raw.NT_GNU_BUILD_ID and name == b"GNU":
                            return desc.hex()
        except OSError as err:
            raise self._read_error(err, "has corrupted notes") from None
        except Exception as err:
            raise ElfError("%s has corrupted notes (%s)"
                           % (self.path, describe_error(err))) from None
        return None

    @property
    def is_pie(self) -> bool:
        """True for position-independent files (PIE executables and shared libraries)."""
        return self.elf_type == ET_DYN

    @property
    def has_symtab(self) -> bool:
        """True when the full (non-dynamic) symbol table is present."""
        return any(s.name == ".symtab" for s in self._symbol_sections)


def describe_error(err: BaseException) -> str:
    """`Type: message` on one line (construct's messages span several)."""
    text = " ".join(str(err).split())
    if not text and isinstance(err, AssertionError):
        text = "a table that makes no sense"
    if len(text) > 200:
        text = text[:197] + "..."
    return "%s: %s" % (type(err).__name__, text) if text else type(err).__name__


def is_elf_for_this_machine(path: str) -> bool:
    """Cheap check of the ELF identity only: magic, 64-bit, little-endian, this machine."""
    try:
        with open(path, "rb") as stream:
            header = stream.read(20)
    except OSError:
        return False
    if len(header) < 20 or header[:4] != ELF_MAGIC:
        return False
    return header[4] == ELFCLASS64 and header[5] == ELFDATA2LSB and \
        struct.unpack_from("<H", header, 18)[0] == MACHINES.get(os.uname().machine.lower())

