"""Fuzzing the two parsers that read untrusted bytes: the ELF reader (pyelftools for the
file's structure, elf.py's bulk symbol reader) and the record decoder. Whatever the input,
the only exceptions allowed out are ElfError (and its subclasses) and DecodeError: anything
else would surface as a traceback in the CLI.

Hypothesis mutates a real small ELF (tests/native/robust_stub.c built as a shared library):
bit flips weighted towards the headers and tables, truncations, overwrites with random or
boundary values, and random files that start like an ELF. The decoder gets random batches
and random records with valid and invalid function ids and phases.

tests/fuzz_corpus/ keeps regression inputs: `elf_mutations.json` describes damaged ELF files
by field (so they apply to whatever gcc builds here), `decoder_records.json` damaged records.
Add every input that ever made a parser crash. A longer coverage-guided run:
bench/fuzz_atheris.py.
"""
import json
import math
import struct
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebpf_cuda.spec import apis, record
from ebpf_cuda.targets.elf import ElfFile
from ebpf_cuda.errors import DecodeError, ElfError
from ebpf_cuda.decode.events import Decoder
from fakecuda import LIB_FLAGS
import records

CORPUS = Path(__file__).parent / "fuzz_corpus"
NAMES = ("cudaMemcpy", "cudaGetDevice", "cudaMalloc", "cudaFree", "robust_semaphore", "nope")
FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BOUNDARY = (0, 1, 7, 8, 0x40, 0x7FFFFFFF, 0xFFFFFFFF, 0x100000000, 2 ** 63 - 1, 2 ** 64 - 1)

HEADER_FIELDS = {"e_type": (16, "H"), "e_machine": (18, "H"), "e_version": (20, "I"),
                 "e_entry": (24, "Q"), "e_phoff": (32, "Q"), "e_shoff": (40, "Q"),
                 "e_ehsize": (52, "H"), "e_phentsize": (54, "H"), "e_phnum": (56, "H"),
                 "e_shentsize": (58, "H"), "e_shnum": (60, "H"), "e_shstrndx": (62, "H")}
SECTION_FIELDS = {"sh_name": (0, "I"), "sh_type": (4, "I"), "sh_flags": (8, "Q"),
                  "sh_addr": (16, "Q"), "sh_offset": (24, "Q"), "sh_size": (32, "Q"),
                  "sh_link": (40, "I"), "sh_info": (44, "I"), "sh_addralign": (48, "Q"),
                  "sh_entsize": (56, "Q")}
SEGMENT_FIELDS = {"p_type": (0, "I"), "p_flags": (4, "I"), "p_offset": (8, "Q"),
                  "p_vaddr": (16, "Q"), "p_paddr": (24, "Q"), "p_filesz": (32, "Q"),
                  "p_memsz": (40, "Q"), "p_align": (48, "Q")}
SYMBOL_FIELDS = {"st_name": (0, "I"), "st_info": (4, "B"), "st_other": (5, "B"),
                 "st_shndx": (6, "H"), "st_value": (8, "Q"), "st_size": (16, "Q")}
DYNAMIC_FIELDS = {"d_tag": (0, "q"), "d_val": (8, "Q")}
DYNAMIC_TAGS = {"DT_NULL": 0, "DT_NEEDED": 1, "DT_STRTAB": 5, "DT_STRSZ": 10, "DT_SONAME": 14}


class Base:
    """The unharmed ELF and where its parts are."""

    def __init__(self, path: Path) -> None:
        self.data = path.read_bytes()
        with open(path, "rb") as f:
            elf = ELFFile(f)
            self.shoff, self.phoff = elf["e_shoff"], elf["e_phoff"]
            self.phnum = elf["e_phnum"]
            self.sections = {}  # name -> (index, header offset, file offset, size)
            for index, section in enumerate(elf.iter_sections()):
                self.sections[section.name] = (index, self.shoff + 64 * index,
                                               section["sh_offset"], section["sh_size"])
            self.symbols = {}  # "section:name" -> entry offset in the file
            for table in (".symtab", ".dynsym"):
                section = elf.get_section_by_name(table)
                for k, symbol in enumerate(section.iter_symbols()):
                    self.symbols["%s:%s" % (table, symbol.name)] = section["sh_offset"] + 24 * k

    def regions(self):
        """(start, end) of the parts worth damaging: headers and tables, then anything."""
        parts = [(0, 64), (self.phoff, self.phoff + 56 * self.phnum),
                 (self.shoff, len(self.data))]
        for name in (".symtab", ".dynsym", ".strtab", ".dynstr", ".dynamic"):
            _, _, offset, size = self.sections[name]
            parts.append((offset, offset + size))
        return parts + [(0, len(self.data))]


@pytest.fixture(scope="module")
def base(cc) -> Base:
    return Base(cc.shared("robust_stub.c", "fuzz_base.so", extra=list(LIB_FLAGS)))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "damaged.so"


def read_symbols(path: Path) -> None:
    """Everything a tracer asks of a file; only ElfError may come out."""
    try:
        elf = ElfFile(str(path))
        functions = elf.functions()
        for name in list(functions)[:40] + list(NAMES):
            try:
                elf.symbol_offset(name)
            except ElfError:
                pass
        elf.has_any(NAMES)
        for address in list(functions.values())[:40]:
            elf.symbolize(address)
            elf.symbolize_offset(address)
    except ElfError:
        pass
    try:  # what pyelftools reads besides: dependencies without symbols, the build id
        elf = ElfFile(str(path), allow_stripped=True)
        elf.build_id
    except ElfError:
        pass


def check_elf(scratch: Path, data: bytes) -> None:
    scratch.write_bytes(data)
    read_symbols(scratch)


# -- ELF: hypothesis ------------------------------------------------------------------------


@FUZZ
@given(st.data())
def test_elf_bit_flips(base, scratch, data):
    damaged = bytearray(base.data)
    regions = base.regions()
    for _ in range(data.draw(st.integers(1, 16), "flips")):
        start, end = data.draw(st.sampled_from(regions), "region")
        position = data.draw(st.integers(start, max(start, min(end, len(damaged)) - 1)))
        damaged[position] ^= 1 << data.draw(st.integers(0, 7))
    check_elf(scratch, bytes(damaged))


@FUZZ
@given(st.data())
def test_elf_truncations(base, scratch, data):
    check_elf(scratch, base.data[:data.draw(st.integers(0, len(base.data)), "length")])


@FUZZ
@given(st.data())
def test_elf_overwrites(base, scratch, data):
    damaged = bytearray(base.data)
    for _ in range(data.draw(st.integers(1, 4), "writes")):
        start, end = data.draw(st.sampled_from(base.regions()), "region")
        position = data.draw(st.integers(start, max(start, end - 8)), "position")
        if data.draw(st.booleans(), "boundary value"):
            value = struct.pack("<Q", data.draw(st.sampled_from(BOUNDARY)))
        else:
            value = data.draw(st.binary(min_size=1, max_size=16), "bytes")
        damaged[position:position + len(value)] = value
    check_elf(scratch, bytes(damaged[:len(base.data)]))


@FUZZ
@given(st.binary(max_size=4096))
def test_elf_random_files(scratch, tail):
    check_elf(scratch, b"\x7fELF\x02\x01\x01" + tail)


# -- ELF: regression corpus -----------------------------------------------------------------


def _put(buffer: bytearray, offset: int, fmt: str, value: int) -> None:
    struct.pack_into("<" + fmt, buffer, offset, value & ((1 << (8 * struct.calcsize(fmt))) - 1))


def apply_mutation(base: Base, case: dict) -> bytes:
    """The base ELF damaged as a corpus entry describes (fields by name, so the entry fits
    whatever the compiler produced)."""
    damaged = bytearray(base.data)
    for field, value in case.get("header", {}).items():
        offset, fmt = HEADER_FIELDS[field]
        _put(damaged, offset, fmt, len(damaged) if value == "filesize" else value)
    for name, fields in case.get("sections", {}).items():
        index, header, _, _ = base.sections[name]
        for field, value in fields.items():
            offset, fmt = SECTION_FIELDS[field]
            if value == "self":
                value = index
            elif isinstance(value, str) and value.startswith("@"):  # another section's index
                value = base.sections[value[1:]][0]
            _put(damaged, header + offset, fmt, value)
    for tag, fields in case.get("dynamic", {}).items():  # the first entry with that tag
        _, _, start, size = base.sections[".dynamic"]
        entry = next(start + k for k in range(0, size, 16)
                     if struct.unpack_from("<q", base.data, start + k)[0] == DYNAMIC_TAGS[tag])
        for field, value in fields.items():
            offset, fmt = DYNAMIC_FIELDS[field]
            _put(damaged, entry + offset, fmt, DYNAMIC_TAGS.get(value, value))
    for key, fields in case.get("symbols", {}).items():
        for field, value in fields.items():
            offset, fmt = SYMBOL_FIELDS[field]
            _put(damaged, base.symbols[key] + offset, fmt, value)
    for which, fields in case.get("segments", {}).items():
        for k in range(base.phnum) if which == "*" else [int(which)]:
            for field, value in fields.items():
                offset, fmt = SEGMENT_FIELDS[field]
                _put(damaged, base.phoff + 56 * k + offset, fmt, value)
    for offset, bit in case.get("flips", []):
        damaged[offset] ^= 1 << bit
    cut = case.get("truncate")
    if cut:
        if "at" in cut:
            damaged = damaged[:cut["at"]]
        elif "from_end" in cut:
            damaged = damaged[:-cut["from_end"]]
        else:
            damaged = damaged[:base.sections[cut["section"]][2] + cut["plus"]]
    return bytes(damaged)


ELF_CASES = json.loads((CORPUS / "elf_mutations.json").read_text())


@pytest.mark.parametrize("case", ELF_CASES, ids=[c["what"] for c in ELF_CASES])
def test_elf_corpus(base, scratch, case):
    check_elf(scratch, apply_mutation(base, case))


def test_elf_corpus_base_is_readable(base, scratch):
    scratch.write_bytes(base.data)
    assert {"cudaMemcpy", "cudaGetDevice"} <= set(ElfFile(str(scratch)).functions())


# -- decoder ----------------------------------------------------------------------------------

FRAME = record.FRAME_SIZE


def decode_all(frames: bytes = b"", payload: bytes = None) -> None:
    decoder = Decoder(clock_offset_ns=0)
    try:
        events = list(decoder.decode_frames(frames)) if payload is None \
            else decoder.decode_record(payload)
    except DecodeError:
        return
    for event in events:
        json.dumps(event.to_json())  # what --json does with it


def make_record(fn_id: int, phase: int, fill: int, ret=None, flags=None, comm=None,
                ts=None) -> bytes:
    """A record of `fill` bytes but for the fields given."""
    return records.with_fields(bytes([fill]) * record.SIZE, fn_id, phase, ret, flags, comm, ts)


@FUZZ
@given(st.binary(max_size=4 * FRAME))
def test_decoder_random_batches(frames):
    decode_all(frames)


@FUZZ
@given(st.integers(0, 3), st.binary(min_size=FRAME, max_size=FRAME))
def test_decoder_random_whole_frames(count, frame):
    decode_all(frame * count)


@FUZZ
@given(st.binary(max_size=2 * record.SIZE))
def test_decoder_random_records(payload):
    decode_all(payload=payload)


@FUZZ
@given(st.integers(0, len(apis.TABLE) + 2), st.sampled_from([0, 1, 2]),
       st.binary(min_size=record.SIZE, max_size=record.SIZE))
def test_decoder_records_of_every_function(fn_id, phase, noise):
    raw = records.with_fields(noise, fn_id, phase)
    decode_all(payload=raw)
    decode_all(frames=records.frame_of(raw))


DECODER_CASES = json.loads((CORPUS / "decoder_records.json").read_text())


@pytest.mark.parametrize("case", DECODER_CASES, ids=[c["what"] for c in DECODER_CASES])
def test_decoder_corpus(case):
    if "frames_hex" in case:
        return decode_all(bytes.fromhex(case["frames_hex"]))
    if "frames_short_by" in case:
        return decode_all(bytes(FRAME - case["frames_short_by"]))
    if "frames_fill" in case:
        return decode_all(bytes([case["frames_fill"]]) * FRAME)
    if "record_hex" in case:
        return decode_all(payload=bytes.fromhex(case["record_hex"]))
    if "record_fill" in case:
        return decode_all(payload=bytes([case["record_fill"]]) * record.SIZE)
    names = [api.name for api in apis.TABLE]
    fn_id = case.get("fn_id")
    if fn_id is None:
        fn = case["fn"]
        if fn != "__past_end__" and fn not in names:
            pytest.skip("%s is not in the table" % fn)
        fn_id = len(names) if fn == "__past_end__" else names.index(fn)
    comm = bytes.fromhex(case["comm_hex"]) if "comm_hex" in case else None
    payload = make_record(fn_id, case["phase"], case["fill"], case.get("ret"),
                          case.get("flags"), comm, case.get("ts"))
    decode_all(payload=payload)
    decode_all(frames=records.frame_of(payload))


def test_decoder_nan_out_parameter_is_json():
    """A float out-parameter read as NaN still becomes a JSON line (json writes NaN)."""
    names = [api.name for api in apis.TABLE]
    if "cudaEventElapsedTime" not in names:
        pytest.skip("cudaEventElapsedTime is not in the table")
    payload = make_record(names.index("cudaEventElapsedTime"), record.PHASE_CALL, 255, ret=0,
                          flags=0)
    events = Decoder(clock_offset_ns=0).decode_record(payload)
    values = [v for v in events[-1].outs.values() if isinstance(v, float)]
    assert values and math.isnan(values[0])


# -- saved traces (`ebpf-cuda report`) --------------------------------------------------------

def good_trace(path: Path, frames=None) -> bytes:
    """A small saved trace (three calls, a named kernel, a loss count) written by SaveWriter."""
    from ebpf_cuda.output import savefile
    from ebpf_cuda.decode.losses import Losses

    writer = savefile.open_save(str(path), apis.TABLE, 1_700_000_000 * 10 ** 9)
    writer.write_frames(frames if frames is not None else b"".join(
        [records.pack_frame("cudaMalloc", 1000, (0x10, 4000)),
         records.pack_frame("cudaFree", 2000, (1,)),
         records.pack_frame("cudaLaunchKernel", 3000, (0x4010, 1, 1, 1, 1))]))
    writer.kernels[(42, 0x4010)] = "k"
    writer.note_losses(Losses(ring_full=3))
    writer.close()
    return path.read_bytes()


_HEADER_AT = {"version": (8, "<H"), "rsize": (10, "<H"), "offset": (12, "<q"),
              "fbytes": (20, "<Q"), "nlen": (28, "<I")}


def damage_trace(data: bytes, case: dict) -> bytes:
    """A saved trace damaged as a corpus case describes it (by field, not by offset)."""
    damaged = bytearray(data)
    nlen = struct.unpack_from("<I", data, 28)[0]
    fbytes = struct.unpack_from("<Q", data, 20)[0]
    names_end = 32 + nlen
    trailer_at = names_end + fbytes
    if "frame_fn_id" in case:
        struct.pack_into("<H", damaged, names_end + 8 + record.FN_ID, case["frame_fn_id"])
    if "names_hex" in case:
        names = bytes.fromhex(case["names_hex"])
        damaged[32:names_end] = names
        struct.pack_into("<I", damaged, 28, len(names))
    if "trailer" in case or "trailer_hex" in case:
        text = case.get("trailer")
        if text is not None and text.startswith("nested:"):
            depth = int(text.split(":")[1])
            text = "[" * depth + "]" * depth
        trailer = text.encode() if text is not None else bytes.fromhex(case["trailer_hex"])
        damaged = damaged[:trailer_at] + trailer
    for field, value in case.get("header", {}).items():
        offset, fmt = _HEADER_AT[field]
        if value == "size+1":
            value = len(damaged) - names_end + 1
        struct.pack_into(fmt, damaged, offset, value)
    if "replace_hex" in case:
        at, raw = case["replace_hex"]["at"], bytes.fromhex(case["replace_hex"]["hex"])
        damaged[at:at + len(raw)] = raw
    if "truncate" in case:
        damaged = damaged[:case["truncate"]]
    return bytes(damaged)


SAVED_CASES = json.loads((CORPUS / "saved_traces.json").read_text())


@pytest.mark.parametrize("case", SAVED_CASES, ids=[c["what"] for c in SAVED_CASES])
def test_saved_trace_corpus_is_one_line_and_exit_12(tmp_path, case):
    """`ebpf-cuda report` of each damaged trace: one line naming the file, exit 12
    (DecodeError), no traceback."""
    import os

    from helpers import run_cli

    path = tmp_path / "damaged.ebpfcuda"
    data = good_trace(tmp_path / "good.ebpfcuda")
    if case.get("fifo"):
        os.mkfifo(path)
    else:
        path.write_bytes(damage_trace(data, case))
    for outputs in (["-o", os.devnull], ["--summary", "--report", str(tmp_path / "r.html")]):
        done = run_cli("report", path, *outputs, timeout=60)
        assert "Traceback" not in done.stderr, done.stderr
        lines = done.stderr.splitlines()
        assert done.returncode == DecodeError.exit_code and len(lines) == 1, done.stderr
        assert lines[0].startswith("ebpf-cuda: ") and str(path) in lines[0], lines[0]
        for word in case["words"]:
            assert word in lines[0], (word, lines[0])


def test_saved_trace_good_base_reads(tmp_path):
    from ebpf_cuda.output import savefile

    good_trace(tmp_path / "good.ebpfcuda")
    saved = savefile.load(str(tmp_path / "good.ebpfcuda"))
    assert [e.api for e in saved if e.phase == "exit"] == ["cudaMalloc", "cudaFree",
                                                           "cudaLaunchKernel"]
    assert saved.kernels == {(42, 0x4010): "k"} and saved.losses.ring_full == 3
    assert saved.incomplete() is None


def _read_trace(path: Path) -> None:
    """What `report` does with a trace, in this process: load, decode, every output."""
    import io

    from ebpf_cuda.output import savefile
    from ebpf_cuda.errors import UsageError
    from ebpf_cuda.output.jsonl import JsonWriter
    from ebpf_cuda.output.text import TextWriter

    try:
        saved = savefile.load(str(path))
        text, lines = TextWriter(io.StringIO(), namer=saved.namer), JsonWriter(io.StringIO())
        for events in saved.batches():
            text.write(events)
            lines.write(events)
        saved.losses.sentence()
        saved.incomplete()
    except (DecodeError, UsageError):
        return


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=12),
       st.integers(0, 1200) | st.none())
def test_saved_trace_random_damage(tmp_path_factory, flips, cut):
    folder = tmp_path_factory.mktemp("saved")
    data = bytearray(good_trace(folder / "good.ebpfcuda"))
    for at, byte in flips:
        if at < len(data):
            data[at] = byte
    (folder / "d.ebpfcuda").write_bytes(bytes(data[:cut] if cut is not None else data))
    _read_trace(folder / "d.ebpfcuda")


@FUZZ
@given(st.binary(max_size=300))
def test_saved_trace_random_trailers(tmp_path_factory, trailer):
    folder = tmp_path_factory.mktemp("saved")
    data = good_trace(folder / "good.ebpfcuda")
    nlen, fbytes = struct.unpack_from("<I", data, 28)[0], struct.unpack_from("<Q", data, 20)[0]
    (folder / "d.ebpfcuda").write_bytes(data[:32 + nlen + fbytes] + trailer)
    _read_trace(folder / "d.ebpfcuda")


# -- bytes from the traced system: paths, comms, kernel names that are not UTF-8 -----------------

# (parse_maps_line strips a path's ends, and ProcessMaps.parse splits saved text at every
# line break str.splitlines knows: whitespace at the ends and those bytes are not kept)
def _keeps(raw: bytes) -> bool:
    text = raw.decode("utf-8", "surrogateescape")
    return b"\0" not in raw and text.strip() == text and len(text.splitlines()) == 1 \
        and not text.endswith(("\n", "\r"))


ODD_BYTES = st.binary(min_size=1, max_size=40).filter(_keeps)
NO_PID = 0x7FFFFFFF  # above any pid_max


@FUZZ
@given(ODD_BYTES, ODD_BYTES, st.binary(min_size=16, max_size=16), ODD_BYTES)
def test_non_utf8_paths_comms_and_kernel_names(tmp_path_factory, folder, name, comm, kernel):
    """A maps line with any bytes in its path (as /proc shows it, os.fsdecode'd as
    discovery.process_mappings reads it), a record with any comm, a kernel name of any bytes
    from the probes' names map: parsed, named, written as text and JSON, never a crash."""
    import io
    import os

    from ebpf_cuda.spec import layout
    from ebpf_cuda.targets.symbols import Frame, ProcessMaps
    from ebpf_cuda.decode.names import KernelNamer
    from ebpf_cuda.output.jsonl import JsonWriter
    from ebpf_cuda.output.text import TextWriter
    from ebpf_cuda.session import Session

    path = os.fsdecode(b"/" + folder.replace(b"/", b"_") + b"/" + name.replace(b"/", b"_"))
    # (a pid no process has: pid 42 is a kernel thread here, and a generated path such as
    # "/./." exists, so the snapshot would rightly reach it through /proc/42/root)
    maps = ProcessMaps.parse(NO_PID, "7f0000000000-7f0000001000 r-xp 00000000 08:01 1234 %s\n"
                             % path)
    assert [p for _, p in maps.mappings] == [path]
    str(Frame("k\udcff", 4, path))
    frame = records.pack_frame("cuLaunchKernel", 1000, (0x99, 1, 1, 1, 1, 1, 1, 0, 0),
                               comm=comm)
    events = list(Decoder(clock_offset_ns=0).decode_frames(frame))

    def names_lookup(key):  # the probes' `names` map: the name bytes as the probe copied them
        return kernel + b"\0" * 8

    session = Session.__new__(Session)
    session.maps = {layout.NAMES: None}
    session._name_lookup = names_lookup  # (what probe_name reads chunks through)
    learned = session.probe_name(42, 0x99)
    namer = KernelNamer(probe_names=session.probe_name)
    namer.handles[(42, 0x99)] = learned
    for writer in (TextWriter(io.StringIO(), namer=namer), JsonWriter(io.StringIO(), namer=namer)):
        writer.write(events)
        for line in writer.stream.getvalue().splitlines():
            line.encode("utf-8")  # what reaches a terminal or file is text
    with open(os.devnull, "w") as null:  # and through a real file descriptor
        writer = TextWriter(null, namer=lambda ev, addr: path)
        writer.write(events)
