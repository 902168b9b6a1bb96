"""The structure of an ELF file, read with pyelftools: ELF header, program headers, section
headers, dynamic tags such as DT_NEEDED/DT_RPATH/DT_RUNPATH/DT_SONAME, notes such as the GNU
build id. `ElfHeaders` is what `elf.ElfFile` builds on (it adds the symbols).

pyelftools is imported on the first file opened (its import costs ~15-20 ms: `import
ebpf_cuda.targets.elf` alone does not pay it). Only pyelftools' cheap, lazy pieces are used: headers
one by one, never its section objects for hash tables, which parse the whole table (a tenth of
a second and more on big libraries), nor its section-name map or dynamic segment, which build
every section.
"""
import errno
import functools
import gc
import os
import stat
import struct
from typing import Any, Dict, List, NamedTuple, Optional

from ..errors import ElfError
from .elf_symbols import SYM_SIZE, SymbolSection

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
ET_EXEC, ET_DYN = 2, 3
EHDR_SIZE = 64
PHDR_SIZE = 56  # Elf64_Phdr
SHDR_SIZE = 64  # Elf64_Shdr
DYN_SIZE = 16  # Elf64_Dyn
MAX_DYNAMIC_TAGS = 65536  # a damaged table without DT_NULL is not read to the end of the file
_STRING_TAGS = {"DT_NEEDED": "needed", "DT_SONAME": "soname", "DT_RPATH": "rpath",
                "DT_RUNPATH": "runpath"}

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
        """What pyelftools cannot say well: not ELF at all, or cut inside its header."""
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

    def _check_identity(self, elf) -> None:
        """64-bit, little-endian, this machine, an executable or shared library."""
        if elf.elfclass != 64:
            raise ElfError("%s is a 32-bit (ELFCLASS32) ELF file; only 64-bit ELF files can be "
                           "traced" % self.path)
        if not elf.little_endian:
            raise ElfError("%s is a big-endian ELF file; only little-endian is supported"
                           % self.path)
        enums = pyelftools().enums
        self.machine = _enum_value(elf["e_machine"], enums.ENUM_E_MACHINE)
        self.elf_type = _enum_value(elf["e_type"], enums.ENUM_E_TYPE)
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
                self._check_ident(stream.read(EHDR_SIZE))
                stream.seek(0)
                self._parse(pyelftools().ELFFile(stream))
        except ElfError:
            raise
        except OSError as err:
            raise self._read_error(err, "is a corrupted ELF file") from None
        except Exception as err:  # pyelftools' ELFError, construct errors, corrupted fields
            raise ElfError("%s is a corrupted ELF file (%s)"
                           % (self.path, describe_error(err))) from None

    def _read_error(self, err: OSError, corrupted: str) -> ElfError:
        if err.errno in (errno.EINVAL, errno.EOVERFLOW):  # a seek to a corrupted offset
            return ElfError("%s %s (an offset past any file's end)" % (self.path, corrupted))
        return ElfError("%s: cannot read: %s" % (self.path, err.strerror or err))

    def _parse(self, elf) -> None:
        """Segments, symbol tables and dynamic tags: header by header through pyelftools
        (get_section and iter_segments would build pyelftools' objects for every section,
        hash tables parsed whole included)."""
        self._check_identity(elf)
        self.entry = elf["e_entry"]
        sections = elf.num_sections()  # e_shnum, or section 0's sh_size when past 0xff00
        self._check_table(elf["e_shoff"], elf["e_shentsize"], sections, SHDR_SIZE,
                          "section header")
        segments = elf.num_segments()  # e_phnum, or section 0's sh_info when 0xffff
        self._check_table(elf["e_phoff"], elf["e_phentsize"], segments, PHDR_SIZE,
                          "program header")
        dynamic_segment = None
        for index in range(segments):
            header = elf._get_segment_header(index)
            if header["p_type"] == "PT_LOAD":
                self.segments.append(Segment(header["p_vaddr"], header["p_offset"],
                                             header["p_filesz"], header["p_memsz"],
                                             header["p_flags"]))
            elif header["p_type"] == "PT_DYNAMIC" and dynamic_segment is None:
                dynamic_segment = index
        headers = [elf._get_section_header(index) for index in range(sections)]
        dynamic_sections = []
        for index, header in enumerate(headers):
            if header["sh_type"] in ("SHT_SYMTAB", "SHT_DYNSYM"):
                self._add_symbol_section(header, headers)
            elif header["sh_type"] == "SHT_DYNAMIC":
                dynamic_sections.append(index)
        for index in dynamic_sections:
            strtab = self._linked_strings(headers[index], headers, "dynamic section")
            if strtab["sh_type"] != "SHT_STRTAB":
                raise ElfError("%s: its dynamic section links to no string table" % self.path)
            self._read_dynamic(elf.get_section(index), headers[index]["sh_size"],
                               strtab["sh_size"])
        if not sections and dynamic_segment is not None:
            # No section table (stripped of it): the loader reads PT_DYNAMIC, so do we (with
            # sections, pyelftools' DynamicSegment would build every section to find its own).
            # Best effort: a damaged one leaves the file without known dependencies.
            try:
                segment = elf.get_segment(dynamic_segment)
                self._read_dynamic(segment, segment["p_filesz"], None)
            except Exception:  # pyelftools' errors, construct's, seek errors
                self.needed, self.soname, self.rpath, self.runpath = [], None, [], []

    def _section_bytes_in_file(self, header, what: str) -> None:
        if header["sh_type"] != "SHT_NOBITS" and \
                header["sh_offset"] + header["sh_size"] > self.size:
            raise ElfError("%s is truncated (its %s runs past the end of the file)"
                           % (self.path, what))

    def _linked_strings(self, header, headers, what: str):
        link = header["sh_link"]
        if not 0 < link < len(headers):
            raise ElfError("%s: its %s links to no string table" % (self.path, what))
        strtab = headers[link]
        self._section_bytes_in_file(header, what)
        self._section_bytes_in_file(strtab, "string table of its " + what)
        return strtab

    def _add_symbol_section(self, header, headers) -> None:
        kind = ".symtab" if header["sh_type"] == "SHT_SYMTAB" else ".dynsym"
        strtab = self._linked_strings(header, headers, kind)
        self._symbol_sections.append(SymbolSection(
            kind, header["sh_offset"], header["sh_size"], header["sh_entsize"] or SYM_SIZE,
            strtab["sh_offset"], strtab["sh_size"]))

    def _read_dynamic(self, table, size: int, strings_size: Optional[int]) -> None:
        """DT_NEEDED, DT_SONAME, DT_RPATH and DT_RUNPATH of a pyelftools DynamicSection (or
        DynamicSegment), up to DT_NULL and never past the table's `size`."""
        for index in range(min(size // DYN_SIZE, MAX_DYNAMIC_TAGS)):
            entry = table._get_tag(index)  # the raw entry: get_tag also looks up its string
            tag = entry["d_tag"]
            if tag == "DT_NULL":
                break
            field = _STRING_TAGS.get(tag)
            if field is None:
                continue
            if strings_size is not None and not 0 <= entry["d_val"] < strings_size:
                raise ElfError("%s: string offset %d of its %s lies outside its string table"
                               % (self.path, entry["d_val"], tag))
            text = getattr(table.get_tag(index), field)
            if tag == "DT_NEEDED":
                self.needed.append(text)
            elif tag == "DT_SONAME":
                self.soname = text
            else:
                paths = self.rpath if tag == "DT_RPATH" else self.runpath
                paths.extend(p for p in text.split(":") if p)

    @property
    def build_id(self) -> Optional[str]:
        """The GNU build id (NT_GNU_BUILD_ID note) in hex, or None; read on first use."""
        if self._build_id is None:
            self._build_id = self._read_build_id() or ""
        return self._build_id or None

    def _read_build_id(self) -> Optional[str]:
        try:
            with open(self.path, "rb") as stream:
                elf = pyelftools().ELFFile(stream)
                notes = [elf.get_section(i) for i in range(elf.num_sections())
                         if elf._get_section_header(i)["sh_type"] == "SHT_NOTE"]
                if not notes:  # no section table: the PT_NOTE segments
                    notes = [elf.get_segment(i) for i in range(elf.num_segments())
                             if elf._get_segment_header(i)["p_type"] == "PT_NOTE"]
                for table in notes:
                    for note in table.iter_notes():
                        if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                            return str(note["n_desc"])
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


class _Pyelftools(NamedTuple):
    ELFFile: Any
    enums: Any


@functools.lru_cache(maxsize=None)
def pyelftools() -> _Pyelftools:
    """pyelftools' ELFFile and enums, imported on first use (not by `import ebpf_cuda.targets.elf`);
    without collections meanwhile (its ~50 modules make objects by the thousand: ~1 ms)."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        from elftools.elf import enums
        from elftools.elf.elffile import ELFFile
    finally:
        if gc_was_enabled:
            gc.enable()
    return _Pyelftools(ELFFile, enums)


def _enum_value(value: Any, names: Dict[str, int]) -> int:
    """pyelftools gives the names of known enum values (`EM_X86_64`), others as numbers."""
    return names.get(value, -1) if isinstance(value, str) else int(value)


def describe_error(err: BaseException) -> str:
    """`Type: message` on one line (construct's messages span several)."""
    text = " ".join(str(err).split())
    if not text and isinstance(err, AssertionError):
        text = "a table pyelftools cannot make sense of"
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

