"""The one-file zipapp: what it holds, that it runs with a bare python3 (a fresh virtual
environment without pip, isolated mode, no site), traces the stand-in, and is importable;
and its bytecode cache: unpacked once per archive into $XDG_CACHE_HOME/ebpf-cuda/<hash>,
used on later runs, safe for concurrent first runs, never taken from a folder that another
user can change, and skipped (running from the archive) when it cannot be written."""
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Dict, Optional

import pytest

from ebpf_cuda import bundle

REPO = Path(__file__).resolve().parent.parent
OTHER_UID = 65534  # nobody


@pytest.fixture(scope="module")
def pyz(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "ebpf-cuda.pyz"
    subprocess.run([sys.executable, "-m", "ebpf_cuda.bundle", "-o", str(out)], check=True,
                   cwd=str(REPO), capture_output=True, timeout=120)
    return out


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """The python of a fresh virtual environment with no pip and nothing installed."""
    env = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True,
                   timeout=120)
    python = str(env / "bin" / "python3")
    missing = subprocess.run([python, "-I", "-S", "-c", "import click"], capture_output=True)
    assert missing.returncode != 0  # nothing but the standard library
    return python


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    """XDG_CACHE_HOME of the tests that do not look at the cache (not root's own ~/.cache)."""
    return tmp_path_factory.mktemp("xdg")


def run(python: str, *args: str, cache: Optional[Path] = None, flags=("-I", "-S"),
        env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    environ = dict(os.environ if env is None else env)
    if cache is not None:
        environ["XDG_CACHE_HOME"] = str(cache)
    return subprocess.run([python, *flags, *args], capture_output=True, text=True,
                          timeout=120, env=environ)


def cache_folder(pyz: Path, xdg: Path) -> Path:
    """Where the archive unpacks itself: a hash of the archive's bytes under ebpf-cuda/."""
    digest = hashlib.blake2b(pyz.read_bytes(), digest_size=16).hexdigest()
    return xdg / bundle.CACHE_NAME / digest


def wait_for(check, what: str, timeout: float = 180.0):
    """check()'s first true value: the first start's background work (bytecode of the
    modules a start does not import, then pruning) ends after the start itself."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.05)


def lists_functions(done: subprocess.CompletedProcess) -> bool:
    return done.returncode == 0 and done.stdout.split()[:1] == ["cudaMalloc"]


MALLOC_FREE = [("cudaMalloc", "[ENTER]"), ("cudaMalloc", "[EXIT]"), ("cudaFree", "[ENTER]"),
               ("cudaFree", "[EXIT]")]


def traced_calls(done: subprocess.CompletedProcess):
    """(function, phase) of each event line the tracer printed."""
    lines = [line.split() for line in done.stdout.splitlines() if " cuda" in line]
    return [(words[2], words[3]) for words in lines if words[2].startswith("cuda")]


def test_holds_the_package_its_dependencies_and_a_main(pyz):
    with zipfile.ZipFile(str(pyz)) as archive:
        names = set(archive.namelist())
    assert {"__main__.py", "ebpf_cuda/cli/main.py", "ebpf_cuda/asm/assemble.py",
            "elftools/elf/elffile.py", "click/core.py"} <= names
    assert not [n for n in names if n.endswith(".pyc") or "__pycache__" in n]
    assert any(n.startswith("licenses/click/") for n in names)
    assert any(n.startswith("licenses/pyelftools/") for n in names)
    assert pyz.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    assert os.stat(str(pyz)).st_mode & 0o111


def test_builds_are_reproducible(pyz, tmp_path):
    again = tmp_path / "again.pyz"
    bundle.build(str(again))
    assert again.read_bytes() == pyz.read_bytes()


def test_runs_with_a_bare_python(pyz, bare_python, shared_cache):
    done = run(bare_python, str(pyz), "--list-functions", cache=shared_cache)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "cudaMalloc"
    helped = run(bare_python, str(pyz), "report", "--help", cache=shared_cache)
    assert helped.returncode == 0 and "FILE" in helped.stdout


def test_errors_keep_their_exit_codes(pyz, bare_python, shared_cache):
    done = run(bare_python, str(pyz), "report", "/nonexistent/file", cache=shared_cache)
    assert done.returncode == 2 and "cannot read" in done.stderr


def test_importable_as_a_vendored_library(pyz, bare_python):
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import ebpf_cuda\n"
            "assert 'click' not in sys.modules\n"
            "from elftools.elf.elffile import ELFFile\n"
            "print(ebpf_cuda.Tracer.__module__, ebpf_cuda.__file__)\n" % str(pyz))
    done = run(bare_python, "-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ebpf_cuda.tracer", str(pyz / "ebpf_cuda" / "__init__.py")]


@pytest.mark.kernel
def test_traces_the_stand_in_with_a_bare_python(root, cc, pyz, bare_python, shared_cache):
    from fakecuda import build_fake_cuda, device_ptr

    _, prog = build_fake_cuda(cc)
    done = run(bare_python, str(pyz), "-t", "--", str(prog), "malloc:4000", "free",
               cache=shared_cache)
    assert done.returncode == 0, done.stderr
    assert traced_calls(done) == MALLOC_FREE
    assert "ptr=0x%x" % device_ptr(0) in done.stdout
    assert cache_folder(pyz, shared_cache).is_dir()


def test_missing_dependency_is_reported(tmp_path):
    with pytest.raises(ImportError, match="no_such_package"):
        bundle.build(str(tmp_path / "x.pyz"), packages=("no_such_package",))


# ---- the bytecode cache ----------------------------------------------------------------------


def test_first_run_unpacks_with_bytecode_and_the_second_uses_it(pyz, bare_python, tmp_path):
    folder = cache_folder(pyz, tmp_path)
    first = run(bare_python, str(pyz), "--list-functions", cache=tmp_path)
    assert lists_functions(first), first.stderr
    tag = sys.implementation.cache_tag
    # The modules a start imports are compiled before it goes on; the rest (elftools: a
    # trace reads ELF files with its own code) in the background, then the marker.
    assert (folder / "ebpf_cuda" / "cli" / "__pycache__" / ("main.%s.pyc" % tag)).is_file()
    wait_for((folder / (".compiled-" + tag)).is_file, "the marker")
    assert (folder / "elftools" / "elf" / "__pycache__" / ("elffile.%s.pyc" % tag)).is_file()
    assert not list(folder.rglob("*.pyc.*"))  # no temporary left
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temporary left
    inode = folder.stat().st_ino
    (folder / "sentinel").write_text("kept")
    # PYTHONDONTWRITEBYTECODE (set in this environment) changes nothing: the bytecode was
    # compiled when unpacking. -v shows where each module comes from.
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    second = run(bare_python, str(pyz), "--list-functions", cache=tmp_path, flags=("-S", "-v"),
                 env=env)
    assert lists_functions(second), second.stderr
    assert "code object from '%s'" % (folder / "ebpf_cuda" / "cli" / "__pycache__" /
                                      ("main.%s.pyc" % tag)) in second.stderr
    assert "zipimporter object" not in second.stderr  # nothing imported from the archive
    assert folder.stat().st_ino == inode and (folder / "sentinel").exists()


def test_cache_root_defaults_to_home_cache(pyz, bare_python, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}
    env["HOME"] = str(tmp_path)
    done = run(bare_python, str(pyz), "--list-functions", env=env)
    assert lists_functions(done), done.stderr
    assert cache_folder(pyz, tmp_path / ".cache").is_dir()
    relative = dict(env, XDG_CACHE_HOME="relative/cache")  # ignored, as the XDG spec says
    assert lists_functions(run(bare_python, str(pyz), "--list-functions", env=relative))
    assert not (tmp_path / "relative").exists()


def test_concurrent_first_runs_all_work(pyz, bare_python, tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    procs = [subprocess.Popen([bare_python, "-I", "-S", str(pyz), "--list-functions"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for _ in range(4)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.split()[0] == "cudaMalloc", err
    folder = cache_folder(pyz, tmp_path)
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]
    assert (folder / "ebpf_cuda" / "cli" / "main.py").read_bytes() == \
        zipfile.ZipFile(str(pyz)).read("ebpf_cuda/cli/main.py")


def test_another_interpreter_compiles_its_own_bytecode(pyz, bare_python, tmp_path):
    others = sorted(Path.home().glob(".pyenv/versions/3.1[0-9]*/bin/python3"))
    mine = sys.implementation.cache_tag
    other = next((str(p) for p in others if subprocess.run(
        [str(p), "-c", "import sys; print(sys.implementation.cache_tag)"],
        capture_output=True, text=True).stdout.strip() not in ("", mine)), None)
    if other is None:
        pytest.skip("no other Python 3.10+ interpreter")
    assert lists_functions(run(bare_python, str(pyz), "--list-functions", cache=tmp_path))
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")
    done = run(other, str(pyz), "--list-functions", flags=("-S",), env=env)
    assert lists_functions(done), done.stderr
    markers = wait_for(lambda: sorted(
        p.name for p in cache_folder(pyz, tmp_path).glob(".compiled-*")) if len(list(
            cache_folder(pyz, tmp_path).glob(".compiled-*"))) == 2 else None, "2 markers")
    assert ".compiled-" + mine in markers


def _unwritable_root_file(tmp_path: Path) -> Path:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    return blocker / "cache"


def test_unwritable_cache_runs_from_the_archive(root, cc, pyz, bare_python, tmp_path):
    from fakecuda import build_fake_cuda

    cache = _unwritable_root_file(tmp_path)  # mkdir fails (ENOTDIR), even for root
    done = run(bare_python, str(pyz), "--list-functions", cache=cache, flags=("-S", "-v"))
    assert lists_functions(done), done.stderr
    assert 'zipimporter object "%s/"' % pyz in done.stderr  # imported from the archive
    _, prog = build_fake_cuda(cc)
    traced = run(bare_python, str(pyz), "-t", "--", str(prog), "malloc:4000", "free",
                 cache=cache)
    assert traced.returncode == 0, traced.stderr
    assert traced_calls(traced) == MALLOC_FREE


def test_read_only_cache_runs_from_the_archive(root, pyz, bare_python, tmp_path):
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    cache = tmp_path / "ro"
    cache.mkdir()
    script = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && '
              'XDG_CACHE_HOME="$0" exec "$@"')
    done = subprocess.run(["unshare", "-m", "sh", "-c", script, str(cache), str(cache),
                           bare_python, "-I", "-S", str(pyz), "--list-functions"],
                          capture_output=True, text=True, timeout=120)
    if "mount" in done.stderr and done.returncode != 0:
        pytest.skip("cannot make a read-only mount here: %s" % done.stderr.strip())
    assert lists_functions(done), done.stderr
    assert list(cache.iterdir()) == []


def test_unwritable_cache_of_an_unprivileged_user(root, pyz):
    """As nobody, with a cache folder nobody cannot write: runs from the archive."""
    if shutil.which("setpriv") is None or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs setpriv and /usr/bin/python3")
    top = Path(tempfile.mkdtemp(prefix="ebpf-cuda-bundle-"))
    try:
        top.chmod(0o755)
        copy = top / "ebpf-cuda.pyz"
        shutil.copy(str(pyz), str(copy))
        copy.chmod(0o755)
        cache = top / "cache"
        cache.mkdir()
        os.chown(str(cache), OTHER_UID, OTHER_UID)
        cache.chmod(0o555)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(top), "XDG_CACHE_HOME": str(cache)}
        done = subprocess.run(["setpriv", "--reuid=%d" % OTHER_UID, "--regid=%d" % OTHER_UID,
                               "--clear-groups", "/usr/bin/python3", "-I", "-S", str(copy),
                               "--list-functions"], capture_output=True, text=True,
                              timeout=120, env=env, cwd=str(top))
        assert lists_functions(done), done.stderr
        assert list(cache.iterdir()) == []
        cache.chmod(0o755)  # writable by nobody: now it is used
        again = subprocess.run(["setpriv", "--reuid=%d" % OTHER_UID, "--regid=%d" % OTHER_UID,
                                "--clear-groups", "/usr/bin/python3", "-I", "-S", str(copy),
                                "--list-functions"], capture_output=True, text=True,
                               timeout=120, env=env, cwd=str(top))
        assert lists_functions(again), again.stderr
        folder = cache_folder(copy, cache)
        assert folder.is_dir() and folder.stat().st_uid == OTHER_UID
    finally:
        shutil.rmtree(str(top), ignore_errors=True)


PLANTED = "import sys; print('PLANTED CODE RAN'); sys.exit(0)\n"


def _plant(folder: Path) -> None:
    """A fake copy of the package that announces itself when imported."""
    (folder / "ebpf_cuda").mkdir(parents=True)
    (folder / "ebpf_cuda" / "__init__.py").write_text(PLANTED)
    (folder / "ebpf_cuda" / "cli").mkdir()
    (folder / "ebpf_cuda" / "cli" / "__init__.py").write_text(PLANTED)
    (folder / "ebpf_cuda" / "cli" / "main.py").write_text(PLANTED)


def _chown_tree(path: Path, uid: int) -> None:
    for top, dirs, files in os.walk(str(path)):
        os.chown(top, uid, uid)
        for name in files:
            os.chown(os.path.join(top, name), uid, uid)


@pytest.mark.parametrize("case", ["cache folder of another user", "hash folder of another user",
                                  "world-writable cache folder", "parent of another user",
                                  "symlink to a folder of another user"])
def test_folders_another_user_controls_are_never_used(root, pyz, bare_python, tmp_path, case):
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    planted = cache_folder(pyz, xdg)
    if case == "symlink to a folder of another user":
        elsewhere = tmp_path / "elsewhere"
        _plant(elsewhere / planted.name)
        _chown_tree(elsewhere, OTHER_UID)
        elsewhere.chmod(0o700)
        (xdg / bundle.CACHE_NAME).symlink_to(elsewhere)
    else:
        _plant(planted)
        planted.parent.chmod(0o700)
        if case == "cache folder of another user":
            _chown_tree(planted.parent, OTHER_UID)
        elif case == "hash folder of another user":
            _chown_tree(planted, OTHER_UID)
        elif case == "world-writable cache folder":
            planted.parent.chmod(0o777)
        elif case == "parent of another user":
            _chown_tree(xdg, OTHER_UID)
            xdg.chmod(0o755)  # others cannot write it, but its owner could swap its contents
    done = run(bare_python, str(pyz), "--list-functions", cache=xdg)
    assert "PLANTED" not in done.stdout + done.stderr
    assert lists_functions(done), done.stderr


def test_sticky_world_writable_parent_is_trusted(pyz, bare_python, tmp_path):
    """As /tmp: others can add entries but not replace ours."""
    xdg = tmp_path / "sticky"
    xdg.mkdir()
    xdg.chmod(0o1777)
    done = run(bare_python, str(pyz), "--list-functions", cache=xdg)
    assert lists_functions(done), done.stderr
    assert cache_folder(pyz, xdg).is_dir()


def test_damaged_cache_folder_falls_back_to_the_archive(pyz, bare_python, tmp_path):
    """A file where the cache's folder should be: the archive runs as it is."""
    folder = cache_folder(pyz, tmp_path)
    folder.parent.mkdir(mode=0o700)
    folder.write_text("not a folder")
    done = run(bare_python, str(pyz), "--list-functions", cache=tmp_path)
    assert lists_functions(done), done.stderr


def test_hot_list_holds_what_a_start_imports(pyz):
    with zipfile.ZipFile(str(pyz)) as archive:
        hot = archive.read(bundle.HOT_LIST).decode().split()
        names = set(archive.namelist())
    assert set(hot) <= names
    assert {"ebpf_cuda/__main__.py", "ebpf_cuda/cli/main.py", "ebpf_cuda/tracer.py",
            "ebpf_cuda/session.py", "ebpf_cuda/output/lines.py", "ebpf_cuda/pump.py",
            "ebpf_cuda/cli/options.py"} <= set(hot)
    # (a trace's start parses its options without click, cli/options.py; nor reads ELF
    # with pyelftools)
    assert not [name for name in hot if name.startswith(("elftools/", "click/"))]


# ---- pruning the folders of other builds ----------------------------------------------------


def _other_build(pyz: Path, folder: Path, note: bytes) -> Path:
    """A copy of the archive that is another build (another hash): its zip comment differs."""
    copy = folder / ("other-%s.pyz" % note.decode())
    shutil.copy(str(pyz), str(copy))
    with zipfile.ZipFile(str(copy), "a") as archive:
        archive.comment = note
    return copy


def _fake_unpacked(root: Path, name: str, age: float, ours: bool = True) -> Path:
    folder = root / name
    (folder / "ebpf_cuda").mkdir(parents=True)
    if ours:
        (folder / "__main__.py").write_text("")
    os.utime(str(folder), (time.time() - age,) * 2)
    return folder


@pytest.mark.kernel
def test_folders_of_other_builds_are_pruned_unless_used(root, cc, pyz, bare_python, tmp_path):
    """A first start removes, in the background, the folders of other builds beyond the 4
    last used, when unused for an hour and held by no running start; never anything else.
    A trace by another build that is running (its command, cat, waits on its input) keeps
    its folder, however old, and ends normally."""
    from fakecuda import build_fake_cuda

    lib, _ = build_fake_cuda(cc)
    cache = tmp_path / "xdg" / bundle.CACHE_NAME
    cache.mkdir(parents=True, mode=0o700)
    hours = {"%032x" % n: 3600 * (2 + n) for n in range(1, 8)}  # ..01 newest, ..07 oldest
    for name, age in hours.items():
        _fake_unpacked(cache, name, age)
    recent = _fake_unpacked(cache, "%032x" % 99, 600)  # beyond the 4, but used 10 min ago
    foreign = [_fake_unpacked(cache, "f" * 32, 9 * 3600, ours=False),  # no __main__.py
               _fake_unpacked(cache, "not-a-build", 9 * 3600)]
    (cache / ("e" * 32)).write_text("a file")
    (cache / ("d" * 32)).symlink_to(_fake_unpacked(tmp_path, "target", 9 * 3600))
    (cache / "programs-0123456789abcdef.programs").write_bytes(b"")
    # A trace by another build, running until its input ends; its folder made old.
    running = _other_build(pyz, tmp_path, b"running")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    waiting = subprocess.Popen([bare_python, "-I", "-S", str(running), "-p", str(lib), "--",
                                "cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        held = cache_folder(running, tmp_path / "xdg")
        wait_for((held / (".compiled-" + sys.implementation.cache_tag)).exists,
                 "the running build's bytecode")
        os.utime(str(held), (time.time() - 99 * 3600,) * 2)  # the oldest of all
        first = run(bare_python, str(pyz), "--list-functions", cache=tmp_path / "xdg")
        assert lists_functions(first), first.stderr
        mine = cache_folder(pyz, tmp_path / "xdg")
        kept = {mine.name, held.name, recent.name} | set(sorted(hours)[:3])
        wait_for(lambda: {p.name for p in cache.iterdir() if p.name in hours} <= kept,
                 "the pruning")
        out, err = waiting.communicate("its input\n", timeout=60)  # cat ends, so does it
    finally:
        waiting.kill()
        waiting.wait()
    assert waiting.returncode == 0 and "Traceback" not in err, err
    assert "its input" in out
    assert held.is_dir()
    names = {p.name for p in cache.iterdir()}
    assert names & set(hours) == set(sorted(hours)[:3])  # the 4 last used: with `recent`
    assert {mine.name, held.name, recent.name, "e" * 32, "d" * 32, "f" * 32, "not-a-build",
            "programs-0123456789abcdef.programs"} <= names
    assert not [n for n in names if n.startswith(".unpack-")]
    assert all(f.is_dir() for f in foreign) and (tmp_path / "target").is_dir()
    # Once it ended, the next build's first start prunes its folder (unused, old).
    later = _other_build(pyz, tmp_path, b"later")
    assert lists_functions(run(bare_python, str(later), "--list-functions",
                               cache=tmp_path / "xdg"))
    wait_for(lambda: not held.exists(), "the ended start's folder pruned")
    assert recent.is_dir() and mine.is_dir()


def test_folder_deleted_while_its_background_compiles(pyz, bare_python, tmp_path):
    """The folder taken away while the first start's background process still compiles in
    it: nothing of it is made again (a folder without its sources would be taken for the
    unpacked archive), and the next start unpacks afresh. (Deleted file by file instead,
    as `rm -rf` does, the writer can leave part of it: then a start fails until it is
    deleted again.)"""
    folder = cache_folder(pyz, tmp_path)
    assert lists_functions(run(bare_python, str(pyz), "--list-functions", cache=tmp_path))
    os.rename(str(folder), str(tmp_path / "gone"))
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert not folder.exists()
        time.sleep(0.05)
    again = run(bare_python, str(pyz), "--list-functions", cache=tmp_path)
    assert lists_functions(again), again.stderr
    assert (folder / "ebpf_cuda" / "cli" / "main.py").is_file()

