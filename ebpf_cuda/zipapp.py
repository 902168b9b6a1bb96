"""The code of the one-file zipapp that `python3 -m ebpf_cuda.bundle` builds (bundle.py says
what it does): its `__main__.py` (MAIN) and the code only a first start runs (FIRST_START_CODE,
the archive's __unpack__.py, compiled only then). Text, not modules of this package: they run
from the archive before the package can be imported, on Python 3.8+ with the standard library.
"""

# The archive's __main__.py: compiled from the archive at every start (no bytecode cache for
# it), so it is short and imports nothing on the warm path beyond what Python has loaded at
# start-up (os, sys, stat) and fcntl (its folder's lock).
MAIN = r'''# ebpf-cuda as one file: runs the command line (python3 ebpf-cuda.pyz --help).
# The first start unpacks the archive, with its modules compiled, into a per-user cache
# folder named after the archive's hash ($XDG_CACHE_HOME/ebpf-cuda/<hash>, else
# ~/.cache/ebpf-cuda/<hash>); every start runs from there when it is safe to, else from the
# archive. Built by `python3 -m ebpf_cuda.bundle` (ebpf_cuda/bundle.py says more).
import os
import stat
import sys

CACHE_NAME = "ebpf-cuda"
FIRST_START = "__unpack__.py"  # the code of a first start (unpack, compile, prune)
HELD = []  # the descriptor of this start's folder, locked (see hold())


def archive_path():
    """The zip archive this __main__ runs from, or None (run from a folder, say)."""
    archive = getattr(globals().get("__loader__"), "archive", None)
    return archive if isinstance(archive, str) and os.path.isfile(archive) else None


def archive_hash(archive):
    """Hex digest of the archive's bytes (_blake2 is built in: no OpenSSL to load)."""
    try:
        from _blake2 import blake2b
    except ImportError:
        from hashlib import blake2b
    with open(archive, "rb") as stream:
        return blake2b(stream.read(), digest_size=16).hexdigest()


def cache_root():
    """$XDG_CACHE_HOME/ebpf-cuda (an absolute XDG_CACHE_HOME), else ~/.cache/ebpf-cuda."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        home = os.environ.get("HOME", "")
        if not os.path.isabs(home):
            import pwd
            home = pwd.getpwuid(os.geteuid()).pw_dir
        base = os.path.join(home, ".cache")
    return os.path.join(base, CACHE_NAME)


def trusted(info, uid, last):
    """A real folder (no symbolic link) that only root and `uid` can change: owned by one of
    them, not writable by group or others unless sticky (as /tmp). `last`: the cache's own
    folder, which must be `uid`'s and writable by it alone."""
    if not stat.S_ISDIR(info.st_mode):
        return False
    if last:
        return info.st_uid == uid and not info.st_mode & 0o022
    return info.st_uid in (0, uid) and (not info.st_mode & 0o022 or info.st_mode & stat.S_ISVTX)


def secure_folder(path, uid):
    """The real path of folder `path`, made (0700) where missing, when it and every folder
    above it are trusted; else None. Each folder is checked before anything is made in it."""
    real = os.path.realpath(path)
    parts = [p for p in real.split(os.sep) if p]
    current = os.sep
    if not trusted(os.lstat(current), uid, not parts):
        return None
    for index, part in enumerate(parts):
        current = os.path.join(current, part)
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            try:
                os.mkdir(current, 0o700)
            except FileExistsError:
                pass
            info = os.lstat(current)
        if not trusted(info, uid, index == len(parts) - 1):
            return None
    return real


def compiled_marker():
    """Name of the file that says this interpreter's bytecode was compiled, or None."""
    tag = sys.implementation.cache_tag
    if tag is None:
        return None
    return ".compiled-%s%s" % (tag, ".opt-%d" % sys.flags.optimize if sys.flags.optimize else "")

def hold(final, uid):
    """An open descriptor of folder `final`, shared-locked for as long as this process runs
    (prune() removes no folder that a start holds) and its time of use touched; None when
    it is not trusted or is being removed."""
    import fcntl
    handle = os.open(final, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    info = os.fstat(handle)
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:  # being removed
        os.close(handle)
        return None
    except OSError:
        pass  # no locks on this file system (ENOLCK): used unheld
    now = os.lstat(final)  # (not renamed away before the lock was ours)
    if not trusted(info, uid, True) or (now.st_ino, now.st_dev) != (info.st_ino, info.st_dev):
        os.close(handle)
        return None
    try:
        os.utime(handle)
    except OSError:
        pass  # (a read-only file system)
    HELD.append(handle)
    return handle


def cached_copy(archive):
    """The folder to run from instead of `archive` (unpacked on first use), or None. A
    first start unpacks the sources and compiles what a start imports; the rest is
    compiled (and old builds' folders pruned) in the background."""
    uid = os.geteuid()
    root = secure_folder(cache_root(), uid)
    if root is None:
        return None
    final = os.path.join(root, archive_hash(archive))
    fresh = not os.path.lexists(final)
    if fresh:
        first_start(archive)["unpack"](archive, root, final)
    if hold(final, uid) is None:
        return None
    marker = compiled_marker()
    if fresh or marker is not None and not os.path.exists(os.path.join(final, marker)):
        first_start(archive)["complete"](root, final, fresh)
    return final


def first_start(archive, loaded={}):
    """The names of the archive's FIRST_START, run (once) beside this module's own: compiled
    only when needed, as this file is compiled from source at every start."""
    if not loaded:
        loaded.update(globals())
        source = __loader__.get_data(os.path.join(archive, FIRST_START))
        exec(compile(source, FIRST_START, "exec"), loaded)
    return loaded


def run_from_cache():
    """Put the cached copy in the archive's place on sys.path, when there is one."""
    archive = archive_path()
    if archive is None:
        return
    try:
        folder = cached_copy(archive)
    except Exception:  # never keep the tool from running: run from the archive
        folder = None
    if folder is None:
        return
    if sys.path and os.path.abspath(sys.path[0]) == os.path.abspath(archive):
        sys.path[0] = folder
    else:
        sys.path.insert(0, folder)


if __name__ == "__main__":
    try:
        run_from_cache()
    except KeyboardInterrupt:  # while unpacking, on the first start
        sys.stderr.write("ebpf-cuda: interrupted by SIGINT while starting\n")
        sys.exit(130)
    # As `python3 -m ebpf_cuda` starts (its stop signals handled before the CLI's imports).
    try:
        from ebpf_cuda.__main__ import run
    except ImportError:
        from ebpf_cuda.cli.main import main as run
    run()
'''
FIRST_START_CODE = r'''# A first start of ebpf-cuda as one file: run by its __main__ beside its own names.
HOT_LIST = ".hot-modules"  # the files a start imports, compiled before it goes on
KEEP_OTHERS = 4  # unpacked folders of other builds kept, the last used (upgrades, rollbacks)
IDLE_AGE = 3600  # seconds: a folder used more recently than this is never removed
BACKGROUND = ".background"  # +marker: locked by a folder's background work while it runs


def compile_files(paths, private=None):
    """Bytecode of each source file of `paths` that has none, for this interpreter: a
    timestamp .pyc as the import system writes it (py_compile itself costs ~12 ms of
    imports). Written atomically, unless `private` is (folder, its final name): a folder
    nobody reads yet, whose code is named after its final place."""
    import marshal
    from importlib.util import MAGIC_NUMBER, cache_from_source
    for path in paths:
        try:
            target = cache_from_source(path)
            if not path.endswith(".py") or os.path.exists(target):
                continue
            shown = path if private is None else private[1] + path[len(private[0]):]
            with open(path, "rb") as stream:
                info = os.fstat(stream.fileno())
                code = compile(stream.read(), shown, "exec", dont_inherit=True)
            header = MAGIC_NUMBER + bytes(4) + (int(info.st_mtime) & 0xFFFFFFFF).to_bytes(
                4, "little") + (info.st_size & 0xFFFFFFFF).to_bytes(4, "little")
            try:  # (not makedirs: a folder deleted meanwhile is not made again, empty)
                os.mkdir(os.path.dirname(target), 0o700)
            except FileExistsError:
                pass
            temporary = target if private else "%s.%d" % (target, os.getpid())
            with open(temporary, "wb") as out:
                out.write(header + marshal.dumps(code))
            if temporary != target:
                os.replace(temporary, target)
        except (SyntaxError, ValueError, OSError):
            pass  # Python compiles it in memory when it imports it


def in_parallel(work, shares):
    """work(share) for each share, the first in this process and each other in a forked
    child (compiling is CPU-bound, one core each). Raises OSError when a child failed; no
    child is left running."""
    children = []
    try:
        for share in shares[1:]:
            pid = os.fork()
            if pid == 0:
                status = 1
                try:
                    work(share)
                    status = 0
                finally:
                    os._exit(status)
            children.append(pid)
        work(shares[0])
    except BaseException:
        for pid in children:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        for pid in children:
            os.waitpid(pid, 0)
        raise
    if any([os.waitpid(pid, 0)[1] for pid in children]):  # (every child reaped)
        raise OSError("a child compiling the archive's modules failed")


def split(items, weight):
    """`items` dealt into one share per usable CPU (at most 8), heaviest first."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    shares = [[] for _ in range(max(1, min(cpus, 8, len(items))))]
    loads = [0] * len(shares)
    for item in sorted(items, key=weight, reverse=True):
        least = loads.index(min(loads))
        shares[least].append(item)
        loads[least] += weight(item)
    return shares


def hot_files(folder):
    """Paths of the sources a start imports (the archive's HOT_LIST) under `folder`."""
    try:
        with open(os.path.join(folder, HOT_LIST)) as listing:
            return {os.path.join(folder, *name.split("/")) for name in listing.read().split()}
    except OSError:
        return set()


def compile_hot(folder):
    """Bytecode of the modules a start imports, shared out among forked children."""
    paths = [path for path in hot_files(folder) if os.path.isfile(path)]
    if paths:
        in_parallel(compile_files, split(paths, lambda p: os.stat(p).st_size))


def mark_compiled(folder):
    """The marker file that says this interpreter's bytecode is there."""
    temporary = os.path.join(folder, "%s.%d" % (compiled_marker(), os.getpid()))
    with open(temporary, "w"):
        pass
    os.replace(temporary, os.path.join(folder, compiled_marker()))


def compile_tree(folder):
    """Bytecode of every module under `folder` for this interpreter, then the marker file."""
    paths = []
    for top, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        paths += [os.path.join(top, name) for name in sorted(files) if name.endswith(".py")]
    compile_files(paths)
    mark_compiled(folder)


def in_background(folder, work):
    """work() in a detached grandchild (its own session, output to /dev/null, nice 19: it
    takes ~1.5 % of a CPU that the tool or the traced command wants), while this start goes
    on; the child between is reaped at once. Not when one runs already for this
    interpreter: it holds the lock of `folder`'s BACKGROUND file until it ends."""
    import fcntl
    lock = os.path.join(folder, BACKGROUND + (compiled_marker() or ""))
    handle = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        pid = os.fork()
    except OSError:  # (BlockingIOError: one runs)
        os.close(handle)
        return
    if pid:
        os.close(handle)  # (the grandchild's copy keeps the lock)
        os.waitpid(pid, 0)
        return
    try:
        if os.fork() == 0:
            os.setsid()
            os.nice(19)  # (not SCHED_IDLE: ~5 times less of a busy CPU, slow to end)
            null = os.open(os.devnull, os.O_RDWR)
            for descriptor in (0, 1, 2):
                os.dup2(null, descriptor)
            work()
    finally:
        os._exit(0)


def unpacked_folder(root, name, uid):
    """The time of last use of `name` in `root` when it is the unpacked folder of a build (a
    hash: a real folder of `uid` holding a __main__.py), else None."""
    if len(name) != 32 or name.strip("0123456789abcdef"):
        return None
    info = os.lstat(os.path.join(root, name))
    if stat.S_ISDIR(info.st_mode) and info.st_uid == uid and \
            os.path.isfile(os.path.join(root, name, "__main__.py")):
        return info.st_mtime  # (a start touches its folder)
    return None


def remove_unless_used(root, folder):
    """Remove `folder` unless a running start holds it (a shared lock, see hold()): locked
    exclusively, renamed away (a start opening it now unpacks afresh), then deleted."""
    import fcntl
    import shutil
    handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: in use
        doomed = os.path.join(root, ".unpack-old-%d-%s" % (os.getpid(), os.urandom(6).hex()))
        os.rename(folder, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    finally:
        os.close(handle)


def prune(root, kept):
    """Remove the folders of other builds beyond the KEEP_OTHERS last used, those unused
    for IDLE_AGE and held by no running start, and the leftovers of starts killed while
    unpacking (an hour old)."""
    import shutil
    import time
    uid, now = os.geteuid(), time.time()
    others = []
    for name in os.listdir(root):
        try:
            path = os.path.join(root, name)
            if name.startswith(".unpack-"):
                if os.lstat(path).st_mtime < now - 3600:
                    shutil.rmtree(path, ignore_errors=True)
            elif name != kept:
                used = unpacked_folder(root, name, uid)
                if used is not None:
                    others.append((used, path))
        except OSError:
            pass
    for used, path in sorted(others, reverse=True)[KEEP_OTHERS:]:
        try:
            if used < now - IDLE_AGE:
                remove_unless_used(root, path)
        except OSError:
            pass


def extract(archive, temporary, final, names):
    """Write `names` of `archive` under the private folder `temporary`, and compile those
    a start imports (creating a file costs ~0.3 ms on some hosts: no more are written)."""
    import zipfile
    written = []
    with zipfile.ZipFile(archive) as zipped:
        for name in names:
            target = os.path.join(temporary, *name.split("/"))
            descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(descriptor, "wb") as out:
                out.write(zipped.read(name))
            written.append(target)
    if compiled_marker() is not None:
        hot = hot_files(temporary)
        compile_files([path for path in written if path in hot], (temporary, final))


def cost(name, size, hot):
    """A file's share of the unpack, in bytes of source compiled: creating a file is worth
    ~1,200 (~0.3 ms on some hosts), and a module a start imports is compiled too (its
    source, plus its .pyc file)."""
    return 1200 + (size + 1200 if name in hot else 0)


def unpack(archive, root, final):
    """The archive's sources written into a private temporary folder in `root`, the
    modules a start imports compiled there (files shared out among forked children), then
    renamed to `final` (losing the race to a concurrent start is fine)."""
    import zipfile

    temporary = os.path.join(root, ".unpack-%d-%s" % (os.getpid(), os.urandom(6).hex()))
    os.mkdir(temporary, 0o700)
    try:
        with zipfile.ZipFile(archive) as zipped:
            sizes = {}
            for entry in zipped.infolist():
                parts = entry.filename.split("/")
                if not entry.is_dir() and not entry.filename.startswith("/") and \
                        not any(p in ("", ".", "..") for p in parts):
                    sizes[entry.filename] = entry.file_size
            if HOT_LIST in sizes:  # (before the children: they read it)
                extract(archive, temporary, final, [HOT_LIST])
                del sizes[HOT_LIST]
        for folder in {os.path.dirname(name) for name in sizes}:
            os.makedirs(os.path.join(temporary, *folder.split("/")), 0o700, exist_ok=True)
        hot = {path[len(temporary) + 1:].replace(os.sep, "/") for path in hot_files(temporary)}
        in_parallel(lambda share: extract(archive, temporary, final, share),
                    split(list(sizes), lambda name: cost(name, sizes[name], hot)))
        try:
            os.rename(temporary, final)
        except OSError:
            if not os.path.isdir(final):
                raise
    finally:
        if os.path.lexists(temporary):
            import shutil
            shutil.rmtree(temporary, ignore_errors=True)


def complete(root, final, fresh):
    """Bytecode of what a start imports (when another interpreter unpacked it), the rest
    in the background; after an unpack, the folders of other builds pruned there too."""
    if compiled_marker() is not None and \
            not os.path.exists(os.path.join(final, compiled_marker())):
        if not fresh:  # (an unpack compiled them)
            compile_hot(final)
        in_background(final, lambda: finish(root, final, fresh))
    elif fresh:
        in_background(final, lambda: prune(root, os.path.basename(final)))


def finish(root, final, fresh):
    """The background part of a first start: every other module's bytecode, the marker,
    then (after an unpack) the folders of other builds pruned."""
    compile_tree(final)
    if fresh:
        prune(root, os.path.basename(final))
'''
