"""probes/cache.py: a start loads the programs an earlier start assembled (the same bytes,
its map fds patched in) and traces exactly as a start that generated them; a file that is
not sound, or not this user's alone, is not read; a changed package is another file."""
import os

import pytest

from ebpf_cuda.decode.events import ENTER, EXIT
from ebpf_cuda.probes import cache, plan
from ebpf_cuda.probes.cache import ProgramCache
from ebpf_cuda.session import Session
from ebpf_cuda.spec.config import TraceConfig
from helpers import trace_command
from test_trace_e2e import expected_args, expected_outs

pytestmark = pytest.mark.kernel

OPS = ("malloc:4000", "memcpy:64:1", "launch:2,1,1:32,1,1", "streamcreate", "free")


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "ebpf-cuda"


def _made(monkeypatch) -> list:
    """The specs whose instructions are generated from now on."""
    made: list = []
    real = plan.ProgramSpec.instructions

    def counted(self, arch):
        made.append(self.key)
        return real(self, arch)

    monkeypatch.setattr(plan.ProgramSpec, "instructions", counted)
    return made


def test_a_second_start_loads_the_first_ones_programs_and_traces_the_same(
        root, fake, cache_home, monkeypatch):
    lib, prog = fake
    made = _made(monkeypatch)
    first, calls, _ = trace_command([prog, *OPS], library=[str(lib)])
    files = [f for f in os.listdir(str(cache_home)) if f.startswith("programs-")]
    assert files == [os.path.basename(cache.cache_file())]
    assert len(made) == len(cache._read(cache.cache_file())) > 10
    assert os.stat(str(cache_home / files[0])).st_mode & 0o777 == 0o600
    del made[:]
    second, calls_again, _ = trace_command([prog, *OPS], library=[str(lib)])
    assert made == []  # every program from the file
    for events, printed in ((first, calls), (second, calls_again)):
        assert [c.fn for c in printed] == [
            "cudaMalloc", "cudaMemcpy", "cudaLaunchKernel", "cudaStreamCreate", "cudaFree"]
        assert [(e.api, e.phase) for e in events] == [
            (c.fn, phase) for c in printed for phase in (ENTER, EXIT)]
        for enter, exit_, call in zip(events[::2], events[1::2], printed):
            assert enter.args == exit_.args == expected_args(call)
            assert (exit_.ret, exit_.outs) == (call.ret, expected_outs(call))


def _codes(options: TraceConfig, store: ProgramCache) -> dict:
    """Each program's bytecode, its map fds written as the maps' names."""
    session = Session(options)
    session._cache = store
    session.start()
    try:
        by_fd = {m.fd: name.encode() for name, m in session.maps.items()}
        codes = {}
        for key, program in session.programs.items():
            code = bytearray(program.code)
            for at in range(0, len(code) - 15, 8):
                if code[at] == 0x18 and code[at + 1] >> 4 in (1, 2):
                    fd = int.from_bytes(code[at + 4:at + 8], "little", signed=True)
                    code[at + 4:at + 8] = by_fd[fd][:4].ljust(4, b"-")
            codes[key] = (program.name, program.expected_attach_type, bytes(code))
        return codes
    finally:
        session.close()


@pytest.mark.parametrize("options", [
    dict(), dict(everything=True), dict(return_probes=False), dict(stacks=True, entries=True),
    dict(aggregate=True, emit=False), dict(follow_children=False, ring_size=1 << 20)])
def test_the_programs_read_are_the_programs_generated(root, fake, cache_home, monkeypatch,
                                                      options):
    lib, prog = fake
    config = TraceConfig(library=(str(lib),), command=(str(prog),), **options)
    generated = _codes(config, ProgramCache(None))  # (None: no file, every program made)
    _codes(config, ProgramCache())  # writes the file
    made = _made(monkeypatch)
    assert _codes(config, ProgramCache()) == generated
    assert made == []


def test_a_file_not_sound_or_not_this_users_alone_is_not_read(root, fake, cache_home):
    lib, _ = fake
    config = TraceConfig(library=(str(lib),), functions=("cudaMalloc",))
    _codes(config, ProgramCache())
    path = cache.cache_file()
    whole = cache._read(path)
    assert len(whole) == 2  # (cudaMalloc's entry and return programs)
    os.chmod(path, 0o622)  # others may write it: its code is not loaded
    assert cache._read(path) == {}
    assert all(cache.Index(path).entry(key) is None for key in whole)
    os.chmod(path, 0o600)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 1)  # the last entry cut short: only it is lost
    read = cache._read(path)
    assert len(read) == 1 and all(whole[key] == entry for key, entry in read.items())
    with open(path, "wb") as f:
        f.write(b"\x00not marshal")
    assert cache._read(path) == {}
    _codes(config, ProgramCache())  # made again, and the file written anew
    assert cache._read(path) == whole


def test_a_start_reads_its_entries_not_the_whole_file(root, fake, cache_home, monkeypatch):
    """A file that gathered many configurations' programs: a start reads the index and its
    own entries (and keeps only those), and loads the same programs as from a file of its
    own."""
    lib, _ = fake
    config = TraceConfig(library=(str(lib),), functions=("cudaMalloc", "cudaFree"))
    own = _codes(config, ProgramCache())
    path = cache.cache_file()
    mine = cache._read(path)
    others = {"other config %d" % i: (bytes(800), [(8, "events")]) for i in range(3000)}
    assert cache._write(path, dict(others, **mine))
    read = []
    real = os.pread

    def counted(fd, size, offset):
        data = real(fd, size, offset)
        read.append(len(data))
        return data

    monkeypatch.setattr(cache.os, "pread", counted)
    made = _made(monkeypatch)
    store = ProgramCache()
    assert _codes(config, store) == own and made == []
    monkeypatch.setattr(cache.os, "pread", real)
    index = cache._HEAD.size + cache._ROW.size * (len(others) + len(mine))
    wanted = sum(len(cache.marshal.dumps((key,) + entry)) for key, entry in mine.items())
    assert sum(read) == index + wanted < os.path.getsize(path) // 20
    assert store._used == mine


def test_a_digest_that_collides_is_a_miss_and_the_program_is_made(root, fake, cache_home,
                                                                  monkeypatch):
    lib, _ = fake
    config = TraceConfig(library=(str(lib),), functions=("cudaMalloc",))
    generated = _codes(config, ProgramCache(None))
    _codes(config, ProgramCache())
    path = cache.cache_file()
    entries = cache._read(path)
    monkeypatch.setattr(cache, "digest", lambda text: 7)  # every key: one digest
    assert cache._write(path, {"not the key": next(iter(entries.values()))})
    made = _made(monkeypatch)
    assert _codes(config, ProgramCache()) == generated
    assert len(made) == 2


def test_a_full_file_keeps_what_this_start_used_and_made(tmp_path, monkeypatch):
    path = str(tmp_path / "programs-x.programs")
    assert cache._write(path, {"old %d" % i: (bytes(8), []) for i in range(5)})
    monkeypatch.setattr(cache, "MAX_ENTRIES", 6)
    store = ProgramCache(path)
    store._used = {"old 3": store.index().entry("old 3")}
    store._new = {"new 1": (bytes(16), []), "new 2": (bytes(24), [(8, "events")])}
    store.save()
    assert cache._read(path) == {"old 3": (bytes(8), []), "new 1": (bytes(16), []),
                                 "new 2": (bytes(24), [(8, "events")])}


def test_a_changed_package_or_relative_cache_home_is_another_file(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "a.py").write_text("x = 1\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c"))
    before = cache.cache_file(str(package))
    assert before.startswith(str(tmp_path / "c" / "ebpf-cuda" / "programs-"))
    assert cache.cache_file(str(package)) == before
    (package / "sub" / "a.py").write_text("x = 22\n")
    assert cache.cache_file(str(package)) != before
    assert cache.cache_file(str(tmp_path / "empty")) is None
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert cache.cache_file(str(package)).startswith(
        os.path.join(os.path.expanduser("~"), ".cache", "ebpf-cuda", "programs-"))


def test_files_of_other_builds_are_pruned_to_the_newest_few(cache_home):
    """Each upgrade of the package or the kernel starts a file: past KEEP_FILES of other
    builds, the oldest go when a start writes its own; other files are left alone."""
    cache_home.mkdir(parents=True)
    olds = []
    for i in range(cache.KEEP_FILES + 3):
        path = cache_home / ("programs-old%02d%s" % (i, cache.SUFFIX))
        path.write_bytes(b"")
        os.utime(str(path), (1000 + i, 1000 + i))
        olds.append(path.name)
    (cache_home / "btf-x.marshal").write_bytes(b"")
    (cache_home / "programs-earlier-format.marshal").write_bytes(b"")  # (whole marshal)
    store = ProgramCache(str(cache_home / ("programs-new" + cache.SUFFIX)))
    store._new = {"key": (b"\x95" + b"\0" * 7, [])}
    store.save()
    left = sorted(os.listdir(str(cache_home)))
    assert left == sorted(["btf-x.marshal", "programs-new" + cache.SUFFIX]
                          + olds[-cache.KEEP_FILES:])
    assert list(cache._read(str(cache_home / ("programs-new" + cache.SUFFIX)))) == ["key"]


def test_a_file_replaced_after_its_index_was_read_gives_no_wrong_program(tmp_path):
    """Another start replaces the file (os.replace) between this start's index and its
    entries: an offset of the old index read in the new file gives a miss or the right
    entry, never another key's program."""
    path = str(tmp_path / ("programs-x" + cache.SUFFIX))
    old = {"key %d" % i: (bytes([i]) * 8 * (i + 1), []) for i in range(6)}
    assert cache._write(path, old)
    index = cache.Index(path)
    new = {"other %d" % i: (bytes([100 + i]) * 16, []) for i in range(4)}
    new["key 2"] = old["key 2"]
    assert cache._write(path, new)  # (offsets all moved)
    for key, entry in old.items():
        assert index.entry(key) in (None, entry)
