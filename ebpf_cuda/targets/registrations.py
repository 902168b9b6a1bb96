"""Kernel names from the registration code nvcc puts in every file that holds kernels.

When a CUDA program or library loads, code that nvcc generated calls, for each kernel,

    __cudaRegisterFunction(handle, hostFun, deviceFun, deviceName, -1, 0, 0, 0, 0, 0)

`hostFun` is the host-side function whose address `cudaLaunchKernel` later receives;
`deviceFun` is the kernel's (mangled) device name — the name the driver, CUPTI and Nsight
show. Reading these pairs from the file itself, rather than from the calls when they are
made, names launches whatever the timing: attached to a process long after it registered
its kernels, a process that exited before its mappings were read, a file with no symbol
table. And it gives the device name, which for lambdas and templates differs from the host
symbol at `hostFun` (in PyTorch's libtorch_cuda.so, 9,245 of 18,890 kernels).

How: each registration call passes `-1` as its fifth argument (`mov $-1, %r8d`, bytes
41 b8 ff ff ff ff), and loads `hostFun` into %rsi and `deviceFun` into %rdx (with
`deviceName`, the same string, in %rcx) just before the call. Every such call site whose
target is `__cudaRegisterFunction` (its PLT entry in a shared library, its symbol in a
program that links cudart statically; without either, the target most sites share whose
arguments have that shape) is read by following the few instruction forms nvcc's host
compilers use for those registers (rip-relative `lea`, a load from the GOT, register
moves) over the bytes since the previous call. A pair is kept only when `hostFun` lies in
executable code and `deviceFun` is a NUL-terminated identifier in the file. x86-64 only.
The code is read in chunks and each name where it lies: a framework's .text, .rodata and
.nv_fatbin are hundreds of MB, never held whole in the tracer's memory. What is kept of a
file (for the whole trace) is two sorted arrays, each hostFun and where its name lies, the
name read again when a launch asks for it (`KernelNames`: PyTorch's libtorch_cuda.so and
libcublasLt.so register ~38,000 kernels, ~17 MB as Python strings and dicts).

CUDA 13's `<<<...>>>` launches with a `cudaKernel_t` that the launch site fetched once, from
`__cudaGetKernel(&handle, hostFun)`, into a static variable: attached later, the handle is
a value the trace never saw made. Its launch site is in the file, though: the code before
the return address of the launch loads the handle from that variable (`mov handle(%rip),
%rdi`), and the file's `__cudaGetKernel` calls tie each variable to its `hostFun`, hence to
its kernel (`launch_site_kernel`).
"""
import os
import re
import struct
from array import array
from bisect import bisect_left
from collections import abc
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

from . import elf_raw

REGISTER = "__cudaRegisterFunction"
_THREAD_LIMIT = re.compile(rb"\x41\xb8\xff\xff\xff\xff", re.S)  # mov $-1, %r8d
_CALL = re.compile(rb"\xe8(....)", re.S)  # call rel32
# lea disp(%rip), reg / mov disp(%rip), reg (a GOT load) / mov reg, reg
_FORMS = re.compile(rb"([\x48\x4c])([\x8d\x8b])([\x05\x0d\x15\x1d\x25\x2d\x35\x3d])(....)"
                    rb"|([\x48\x49\x4c\x4d])\x89([\xc0-\xff])", re.S)
_NAME = re.compile(rb"[A-Za-z_][A-Za-z0-9_$.]*")
_PLT_JUMP = re.compile(rb"\xff\x25(....)", re.S)  # jmp *disp(%rip)
WINDOW = 96  # bytes before a call searched for its arguments (nvcc's sequence: ~50)
_RSI, _RDX, _RCX = 6, 2, 1
_R_X86_64_64, _R_X86_64_GLOB_DAT, _R_X86_64_RELATIVE = 1, 6, 8
_WRITE, _EXECINSTR = 0x1, 0x4
_SYM_NAME = struct.Struct("<I20x")  # Elf64_Sym: st_name, then 20 bytes

GET_KERNEL = "__cudaGetKernel"
_RDI = 7
_LEA_RDI_CALL = re.compile(rb"\x48\x8d\x3d....(?:.{0,12}?)\xe8(....)", re.S)


class Table(abc.Mapping):
    """{int: int} kept as two sorted arrays, 16 bytes an entry (a dict of ints costs ~100):
    a framework's file registers ~25,000 kernels, kept per file while the trace runs."""

    def __init__(self, pairs: Mapping) -> None:
        keys = sorted(pairs)
        self._keys = array("q", keys)
        self._values = array("q", [pairs[key] for key in keys])

    def _index(self, key: object) -> int:
        if not isinstance(key, int) or not -_BIG <= key < _BIG:
            return -1
        i = bisect_left(self._keys, key)
        return i if i < len(self._keys) and self._keys[i] == key else -1

    def _value(self, i: int):
        return self._values[i]

    def __getitem__(self, key: int):
        i = self._index(key)
        if i < 0:
            raise KeyError(key)
        return self._value(i)

    def __contains__(self, key: object) -> bool:
        return self._index(key) >= 0

    def __iter__(self) -> Iterator[int]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


class KernelNames(Table):
    """{hostFun: device name}, each name read in the file when asked (kept: where it lies;
    the names of a framework's ~25,000 kernels are ~7 MB as strings). A file changed since
    it was read names nothing."""

    def __init__(self, path: str, identity: Tuple[int, ...], offsets: Mapping) -> None:
        super().__init__(offsets)
        self._path, self._identity = path, identity

    def _value(self, i: int) -> Optional[str]:
        try:
            with open(self._path, "rb") as stream:
                if _identity(os.fstat(stream.fileno())) != self._identity:
                    return None
                return _name_in(stream, self._values[i], _NAME_LIMIT)
        except OSError:
            return None


def _identity(info: os.stat_result) -> Tuple[int, ...]:
    """What says a file is the one read before (its content unchanged)."""
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


class Registrations:
    """What one file registers: `kernels` {hostFun: device name}; `handles` {address of a
    launch site's cudaKernel_t variable: hostFun} from its `__cudaGetKernel` calls."""

    def __init__(self, path: str, kernels: Mapping, handles: Mapping,
                 code_at: Optional[Tuple[int, int, int]] = None) -> None:
        self.path = path
        self.kernels = kernels
        self.handles = handles
        self._code_at = code_at  # (.text address, size, file offset)
        self._sites: Dict[int, Optional[str]] = {}

    def launch_site_kernel(self, return_address: int) -> Optional[str]:
        """The kernel a launch whose return address is `return_address` (a virtual address
        of this file) runs, when the code before it loads a `__cudaGetKernel` handle."""
        if not self.handles or self._code_at is None:
            return None
        if return_address not in self._sites:
            self._sites[return_address] = self._site(return_address)
        return self._sites[return_address]

    def _site(self, return_address: int) -> Optional[str]:
        start, size, offset = self._code_at
        if not start + WINDOW <= return_address <= start + size:
            return None
        try:
            with open(self.path, "rb") as stream:
                stream.seek(offset + return_address - WINDOW - start)
                window = stream.read(WINDOW)
        except OSError:
            return None
        if window[-5:-4] != b"\xe8" and window[-6:-4] != b"\xff\x15":
            return None  # not the return address of a call
        handle = _registers(window, return_address - WINDOW).get(_RDI)
        if not isinstance(handle, tuple):
            return None
        host = self.handles.get(handle[1])
        return self.kernels.get(host) if host is not None else None


_NOTHING = Registrations("", {}, {})
_cache: Dict[Tuple[object, ...], Registrations] = {}  # (path, identity)
_CACHE_LIMIT = 64


def registered_kernels(path: str) -> Mapping:
    """{hostFun virtual address: device name} of the kernels `path` registers ({} for a
    file with none, or one that cannot be read). Cached while the file is unchanged."""
    return registrations(path).kernels


def launch_site_kernel(path: str, return_address: int) -> Optional[str]:
    """The kernel launched from `return_address` (a virtual address in `path`) with a
    handle from `__cudaGetKernel`, if the code there says (see the module's docstring)."""
    return registrations(path).launch_site_kernel(return_address)


def registrations(path: str) -> Registrations:
    """What `path` registers, read once while the file is unchanged."""
    try:
        info = os.stat(path)
    except OSError:
        return _NOTHING
    key = (path,) + _identity(info)
    found = _cache.get(key)
    if found is None:
        try:
            with open(path, "rb") as stream:
                found = _read(path, stream)
        except Exception:  # noqa: BLE001 - any damaged file just names nothing
            found = _NOTHING
        if len(_cache) >= _CACHE_LIMIT:
            _cache.pop(next(iter(_cache)))
        _cache[key] = found
    return found


def _read(path: str, stream) -> Registrations:
    elf = elf_raw.ElfTables(stream)
    if elf.header.e_machine != elf_raw.EM_X86_64:
        return _NOTHING
    text = elf.section(".text")
    if text is None:
        return _NOTHING

    def targets() -> Tuple[Optional[int], Optional[int]]:  # (only files with a candidate)
        return (_plt_entry(elf, REGISTER) or _symbol(stream, REGISTER),
                _plt_entry(elf, GET_KERNEL) or _symbol(stream, GET_KERNEL))

    base, size = text.sh_addr, text.sh_size
    scan = _Scan(base, targets)
    _scan(stream, text.sh_offset, size, scan)
    if scan.targets is None:
        return _NOTHING
    target, getter = scan.targets
    calls = range(len(scan.sites)) if target else _likeliest(elf, stream, scan.sites)
    # (made compact before the handles are: a framework's ~25,000 of each, never both dicts)
    read = _identity(os.fstat(stream.fileno()))  # (the file read: names are read from it)
    kernels = KernelNames(path, read, _pairs(elf, stream, scan.sites, calls))
    handles = Table(_handles(elf, scan.gets, getter, kernels) if kernels else {})
    return Registrations(path, kernels, handles, (base, size, text.sh_offset))


_GOT, _OK = 1, 2  # a site's flags: its host is a GOT slot; its registers decoded
_BIG = 1 << 63  # (array("q"))


class _Sites:
    """Decoded call sites in file order, as columns (no bytes kept): the call's target and
    two register values (a registration: hostFun, deviceFun; a `__cudaGetKernel` call:
    hostFun, the handle variable), with flags (_GOT, _OK)."""

    def __init__(self) -> None:
        self.targets, self.first, self.second = array("q"), array("q"), array("q")
        self.flags = array("B")

    def __len__(self) -> int:
        return len(self.flags)

    def add(self, target: int, first: object, second: object) -> None:
        """A site with two register values (None: unknown), ("got", slot) for a GOT load
        in `first`; any unknown or past 64 bits (never a kernel's address): not decoded."""
        flags = _OK
        if isinstance(first, tuple):
            first, flags = first[1], _OK | _GOT
        if not all(isinstance(v, int) and -_BIG <= v < _BIG for v in (first, second)):
            first = second = flags = 0
        self.targets.append(target if -_BIG <= target < _BIG else -_BIG)
        self.first.append(first)
        self.second.append(second)
        self.flags.append(flags)


class _Scan:
    """What _scan keeps: each site decoded while its bytes are in the buffer, only the calls
    to `__cudaRegisterFunction` and `__cudaGetKernel` where their addresses are known
    (`targets`, found at the first candidate), every candidate's where they are not."""

    def __init__(self, base: int, targets) -> None:
        self.base, self.find_targets = base, targets
        self.targets: Optional[Tuple[Optional[int], Optional[int]]] = None
        self.sites, self.gets = _Sites(), _Sites()
        self.ends: Dict[int, int] = {}  # target -> end of its previous call (in .text)

    def register(self, buf, buf_at: int, at: int) -> None:
        """The registration candidate whose call is at buf[at]: decoded over the bytes since
        the previous call to the same target (the registers an earlier call set are gone)."""
        where = at + buf_at
        target = self.base + where + 5 + struct.unpack_from("<i", buf, at + 1)[0]
        if self.targets is None:
            self.targets = self.find_targets()
        if self.targets[0] and target != self.targets[0]:
            return
        start = max(self.ends.get(target, 0), where - WINDOW)
        self.ends[target] = where + 5
        regs = _registers(buf[start - buf_at:at], self.base + start)
        host, name = regs.get(_RSI), regs.get(_RDX)
        if name is None or isinstance(name, tuple) or name != regs.get(_RCX, name) \
                or host is None:
            host = name = None
        self.sites.add(target, host, name)

    def get(self, buf, buf_at: int, at: int) -> None:
        """The `lea var(%rip), %rdi; ...; call` at buf[at]: kept when %rdi is an address and
        %rsi known (a `__cudaGetKernel(&var, hostFun)` candidate)."""
        where = at + buf_at
        target = self.base + where + 5 + struct.unpack_from("<i", buf, at + 1)[0]
        getter = self.targets[1] if self.targets is not None else None
        if getter is not None and target != getter:
            return
        start = max(0, where - 48)
        regs = _registers(buf[start - buf_at:at], self.base + start)
        variable, host = regs.get(_RDI), regs.get(_RSI)
        if isinstance(variable, int) and host is not None:
            self.gets.add(target, host, variable)


_CHUNK = 1 << 20  # bytes of .text (or of a table) read at once: never held whole (hundreds of MB)
_AHEAD = 64  # bytes a match may need past its start (the call after `mov $-1, %r8d`: 54)


def _scan(stream, offset: int, size: int, scan: _Scan) -> None:
    """Hands `scan` the registration call sites (the first call after each `mov $-1,
    %r8d`) and the `lea var(%rip), %rdi; ...; call` sites of .text, read in chunks into one
    buffer that keeps the WINDOW bytes before the next matches."""
    buf = bytearray(min(_CHUNK, size) + WINDOW + _AHEAD)
    have, buf_at, read = 0, 0, 0  # buf[:have] holds .text[buf_at:read]
    done = [0, 0]  # where each pattern's next search starts (as finditer over the whole)
    while read < size:
        stream.seek(offset + read)
        got = stream.readinto(memoryview(buf)[have:have + min(_CHUNK, size - read)])
        if not got:
            break
        have, read = have + got, read + got
        limit = read - _AHEAD if read < size else read  # match starts taken this round
        for found in _THREAD_LIMIT.finditer(buf, done[0] - buf_at, have):
            if found.start() + buf_at >= limit:
                break
            call = _CALL.search(buf, found.end(), min(found.end() + 48, have))
            if call is not None:
                scan.register(buf, buf_at, call.start())
        done[0] = limit
        for call in _LEA_RDI_CALL.finditer(buf, done[1] - buf_at, have):
            if call.start() + buf_at >= limit:
                break
            scan.get(buf, buf_at, call.end() - 5)
            done[1] = call.end() + buf_at
        done[1] = max(done[1], limit)
        keep = max(0, min(done) - WINDOW - buf_at)  # (the windows before later matches)
        buf[:have - keep] = buf[keep:have]
        have, buf_at = have - keep, buf_at + keep


def _handles(elf, gets: _Sites, getter: Optional[int], kernels: Mapping) -> Dict[int, int]:
    """{handle variable: hostFun} of the file's `__cudaGetKernel(&variable, hostFun)`
    calls (without a symbol for it: the calls whose %rsi is a registered hostFun)."""
    targets, hosts, variables, flags = gets.targets, gets.first, gets.second, gets.flags
    if getter is None:  # the target whose calls pass registered hostFuns
        scores: Dict[int, int] = {}
        for i, target in enumerate(targets):
            scores[target] = scores.get(target, 0) + (
                not flags[i] & _GOT and hosts[i] in kernels)
        getter = max(scores, key=scores.get, default=None)
        if getter is None or not scores[getter]:
            return {}
    slots = _got_values(elf, {hosts[i] for i, target in enumerate(targets)
                              if target == getter and flags[i] & _GOT})
    handles: Dict[int, int] = {}
    for i, target in enumerate(targets):
        if target != getter:
            continue
        address = slots.get(hosts[i]) if flags[i] & _GOT else hosts[i]
        if address in kernels:
            handles[variables[i]] = address
    return handles


def _likeliest(elf, stream, sites: _Sites) -> List[int]:
    """No symbol says where __cudaRegisterFunction is (a stripped program): the call target
    most sites share whose arguments look like a registration's."""
    by_target: Dict[int, List[int]] = {}
    for i, target in enumerate(sites.targets):
        by_target.setdefault(target, []).append(i)
    best: List[int] = []
    for calls in by_target.values():
        if len(calls) > len(best) and _pairs(elf, stream, sites, calls[:8]):
            best = calls
    return best


def _pairs(elf, stream, sites: _Sites, calls) -> Dict[int, int]:
    """{hostFun: file offset of its device name} of the registration calls `calls`."""
    executable, strings = _ranges(elf)
    table: Dict[int, int] = {}
    got: List[Tuple[int, int]] = []
    for i in calls:
        if not sites.flags[i] & _OK:
            continue
        device = _string(stream, strings, sites.second[i])
        if device is None:
            continue
        host = sites.first[i]
        if sites.flags[i] & _GOT:
            got.append((host, device))
        elif _inside(executable, host):
            table[host] = device
    if got:
        slots = _got_values(elf, {slot for slot, _ in got})
        for slot, device in got:
            host = slots.get(slot)
            if host is not None and _inside(executable, host):
                table[host] = device
    return table


def _registers(window: bytes, address: int) -> Dict[int, object]:
    """What the registers hold at the end of `window`, for the forms in _FORMS: an address,
    ("got", slot address) for a load from the GOT, or absent when unknown."""
    regs: Dict[int, object] = {}
    for form in _FORMS.finditer(window):
        if form.group(1):
            reg = ((form.group(3)[0] >> 3) & 7) + (8 if form.group(1) == b"\x4c" else 0)
            where = address + form.end() + struct.unpack("<i", form.group(4))[0]
            regs[reg] = where if form.group(2) == b"\x8d" else ("got", where)
        else:
            rex, modrm = form.group(5)[0], form.group(6)[0]
            source = ((modrm >> 3) & 7) + (8 if rex & 4 else 0)
            value = regs.get(source)
            destination = (modrm & 7) + (8 if rex & 1 else 0)
            if value is None:
                regs.pop(destination, None)
            else:
                regs[destination] = value
    return regs


def _ranges(elf) -> Tuple[List[Tuple[int, int]], List[Tuple[int, int, int]]]:
    """Executable address ranges; (start, end, file offset) of the read-only data sections
    (strings live there; writable data is never a kernel's name), read only where a name
    is (a framework's are hundreds of MB: .rodata, .nv_fatbin)."""
    executable, strings = [], []
    for section in elf.sections:
        start, size = section.sh_addr, section.sh_size
        if not start or section.sh_type != elf_raw.SHT_PROGBITS:
            continue
        if section.sh_flags & _EXECINSTR:
            executable.append((start, start + size))
        elif not section.sh_flags & _WRITE:
            strings.append((start, start + size, section.sh_offset))
    return executable, strings


def _inside(ranges: List[Tuple[int, int]], address: int) -> bool:
    return any(start <= address < end for start, end in ranges)


_NAME_READ = 4096  # bytes read for one name at first (then more, up to the section's end)
_NAME_LIMIT = 1 << 20  # (a name read again: found NUL-terminated in its section before)


def _string(stream, strings: List[Tuple[int, int, int]], address: int) -> Optional[int]:
    """The file offset of the identifier at `address` in a read-only section, or None."""
    for start, end, offset in strings:
        if start <= address < end:
            at = offset + address - start
            return at if _name_in(stream, at, end - address) is not None else None
    return None


def _name_in(stream, at: int, limit: int) -> Optional[str]:
    """The NUL-terminated identifier at file offset `at`, read in at most `limit` bytes."""
    stream.seek(at)
    text = stream.read(min(_NAME_READ, limit))
    while b"\0" not in text and len(text) < limit:  # (a long name)
        more = stream.read(min(16 * _NAME_READ, limit - len(text)))
        if not more:
            break
        text += more
    text = text.split(b"\0", 1)[0]
    return text.decode() if _NAME.fullmatch(text) else None


def _plt_entry(elf, name: str) -> Optional[int]:
    """The address of the PLT entry that jumps through `name`'s GOT slot (shared objects
    and programs that import it), or None."""
    rela = elf.section(".rela.plt")
    index = _dynamic_index(elf, name)
    if rela is None or index is None:
        return None
    slots = {offset for offset, info, _ in struct.iter_unpack("<QQq", _whole(elf.data(rela), 24))
             if info >> 32 == index}
    for section_name in (".plt.sec", ".plt"):
        section = elf.section(section_name)
        if section is None:
            continue
        data, start = elf.data(section), section.sh_addr
        for jump in _PLT_JUMP.finditer(data):
            if start + jump.end() + struct.unpack("<i", jump.group(1))[0] in slots:
                return start + jump.start() // 16 * 16  # (entries are 16 bytes)
    return None


def _whole(data: bytes, unit: int) -> bytes:
    """`data` without a last, partial entry of `unit` bytes."""
    return data[:len(data) - len(data) % unit]


def _dynamic_index(elf, name: str) -> Optional[int]:
    """The index of `name` in .dynsym (raw reads, in chunks: a framework's tables are tens
    of MB)."""
    dynsym, dynstr = elf.section(".dynsym"), elf.section(".dynstr")
    if dynsym is None or dynstr is None:
        return None
    needle = b"\0" + name.encode() + b"\0"
    at = -1
    for where, data in _chunks(elf.stream, dynstr, len(needle) - 1):
        found = data.find(needle)
        if found >= 0:
            at = where + found
            break
    if at < 0:
        return None
    index = 0
    for _, data in _chunks(elf.stream, dynsym, 0, _SYM_NAME.size):
        for (string,) in _SYM_NAME.iter_unpack(data):
            if string == at + 1:
                return index
            index += 1
    return None


def _chunks(stream, section, overlap: int, unit: int = 1):
    """(offset in the section, bytes) of a section read in chunks of whole `unit`s, each
    starting `overlap` bytes before the previous one's end (a string across two)."""
    offset, size = section.sh_offset, section.sh_size - section.sh_size % unit
    step = max(unit, _CHUNK // unit * unit)
    at = 0
    while at < size:
        stream.seek(offset + at)
        data = stream.read(min(step + overlap, size - at))
        if not data:
            return
        yield at, data
        at += step


def _symbol(stream, name: str) -> Optional[int]:
    """`name`'s address from the symbol table (a program with cudart linked in)."""
    from .elf import open_elf

    try:
        symbol = open_elf(stream.name, allow_stripped=True).symbol(name)
    except Exception:  # noqa: BLE001
        return None
    return symbol.value if symbol is not None and symbol.value else None


def _got_values(elf, wanted) -> Dict[int, int]:
    """What the dynamic loader puts in each wanted GOT slot (relative and symbol
    relocations of defined symbols), read in bulk (large libraries hold ~10^6)."""
    rela, dynsym = elf.section(".rela.dyn"), elf.section(".dynsym")
    if rela is None or not wanted:
        return {}
    values: Dict[int, int] = {}
    by_symbol: Dict[int, List[Tuple[int, int]]] = {}  # .dynsym index -> (slot, addend)
    for _, data in _chunks(elf.stream, rela, 0, 24):
        for offset, info, addend in struct.iter_unpack("<QQq", data):
            if offset not in wanted:
                continue
            kind, index = info & 0xFFFFFFFF, info >> 32
            if kind == _R_X86_64_RELATIVE:
                values[offset] = addend
            elif kind in (_R_X86_64_64, _R_X86_64_GLOB_DAT):
                by_symbol.setdefault(index, []).append((offset, addend))
    if by_symbol and dynsym is not None:
        for index, slots in by_symbol.items():
            if (index + 1) * 24 > dynsym.sh_size:
                continue
            elf.stream.seek(dynsym.sh_offset + index * 24 + 8)
            value = struct.unpack("<Q", elf.stream.read(8))[0]
            for offset, addend in slots:
                if value:
                    values[offset] = value + addend
    return values
