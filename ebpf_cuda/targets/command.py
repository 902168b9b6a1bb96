"""The traced command: forked at once, held before exec until the probes are on, so that
its first call is seen; then waited for.

The command starts as a shell would start it: every signal this process handles (a
Python handler) is back to its default action, SIGPIPE and SIGXFSZ too (Python ignores
them for itself), signals ignored when the tracer started stay ignored, and the signal mask
is the one the tracer had. While it is held (still this program, before exec) every
signal is blocked in it: a Ctrl-C then never runs the tracer's code in the child; one that
arrives just before exec acts on the command as soon as the mask is restored (it stops it,
or the command never starts). Signals meant for the command (`signal()`) are sent only once
it has exec'd.
"""
import errno
import os
import signal
import threading
import time
from typing import Iterable, List, Optional, Sequence

from ..descriptors import restore_memlock_limit

# Python ignores these for itself at start-up; a shell's commands get them at default.
_PYTHON_IGNORES = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ")
                        if hasattr(signal, name))
HELD_EXIT = 125  # the child's exit code when it is let go without running the command
_UNBLOCKABLE = {signal.SIGKILL, signal.SIGSTOP}
_command_mask: Optional[set] = None  # see give_commands_mask


def give_commands_mask(mask: Iterable[int]) -> None:
    """The signal mask commands start with, for a program that blocks signals to take them
    in a thread of its own (the command line tool): the mask it was started with. Without
    it a command gets the mask of the thread that starts it."""
    global _command_mask
    _command_mask = set(mask)


def commands_mask() -> Optional[set]:
    """The mask given by give_commands_mask, if any."""
    return None if _command_mask is None else set(_command_mask)


def _all_signals() -> set:
    if hasattr(signal, "valid_signals"):  # Python 3.8+
        return set(signal.valid_signals()) - _UNBLOCKABLE
    return set(range(1, signal.NSIG)) - _UNBLOCKABLE


class HeldCommand:
    """A child process that execs `argv` once `release()` is called."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = list(argv)
        self.exit_status: Optional[int] = None
        self.exec_error: Optional[OSError] = None  # why exec failed (then exit 126 or 127)
        self.released = False  # release() was called: the command runs or is about to
        self.execed = False  # exec succeeded (or the child ended on its way to it)
        self.cancelled = False  # cancel() was called first: the command never runs
        self._pending: List[int] = []  # signals for the command, sent once it has exec'd
        self._lock = threading.Lock()  # release, cancel and signal may come from two threads
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])  # this thread's, restored after
        child_mask = mask if _command_mask is None else _command_mask  # the command's
        fds: List[int] = []
        try:
            fds += os.pipe()
            fds += os.pipe2(os.O_CLOEXEC)  # closed by a successful exec
        except OSError as err:
            for fd in fds:
                os.close(fd)
            raise OSError(err.errno, "cannot start %s: %s" % (self.argv[0], err.strerror)) \
                from None
        go_read, go_write, status_read, status_write = fds
        try:
            # Blocked across the fork: no handler of ours can run in the child. (A signal
            # caught before has its handler run by this call, which may raise.)
            signal.pthread_sigmask(signal.SIG_BLOCK, _all_signals())
            pid = os.fork()
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            for fd in (go_read, go_write, status_read, status_write):
                os.close(fd)
            raise
        if pid == 0:  # child: every signal blocked; wait for the go, then exec
            _child(go_read, go_write, status_read, status_write, child_mask, self.argv)
        self.pid = pid
        self._release_fd: Optional[int] = go_write
        self._status_fd: Optional[int] = status_read
        os.close(go_read)
        os.close(status_write)
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a pending handler runs here
        except BaseException:
            self.close()
            raise

    def release(self) -> None:
        """Let the command run (once); returns once it has exec'd (or failed to: then
        `exec_error` says why and the exit status is 126 or 127, as a shell's)."""
        with self._lock:
            if self._release_fd is None or self.cancelled:
                return
            self.released = True  # from here on a signal is for the command, not start-up
        try:
            os.write(self._release_fd, b"g")
        except OSError:  # the child is gone already (killed): poll() says how
            pass
        self._close_release()
        self._read_exec_status()
        with self._lock:
            self.execed = True
            pending, self._pending = self._pending, []
        for signum in pending:
            self.signal(signum)

    def cancel(self) -> bool:
        """Never run the command, unless it was released already: True when it never runs
        (the child exits HELD_EXIT at once), False when it runs."""
        with self._lock:
            if self.released:
                return False
            self.cancelled = True
        self._close_release()
        return True

    def _read_exec_status(self) -> None:
        """Wait until the child has exec'd (EOF: the pipe was close-on-exec) or says why
        it could not (an errno)."""
        fd, self._status_fd = self._status_fd, None
        if fd is None:
            return
        data = b""
        try:
            while True:
                chunk = os.read(fd, 64)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
        if data:
            number = int(data) if data.isdigit() else 0
            self.exec_error = OSError(number, os.strerror(number) if number else "exec failed")

    def signal(self, signum: int) -> bool:
        """Send `signum` to the command once it runs its own program: at once when it has
        exec'd, right after exec when it is on its way. False (nothing sent) while it is
        held or once it has ended."""
        with self._lock:
            if self.exit_status is not None or not self.released:
                return False
            if not self.execed:
                self._pending.append(signum)
                return True
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            return False
        return True

    def close(self) -> None:
        """Without a release: the child exits (HELD_EXIT) without running the command, and
        is reaped."""
        if self._release_fd is not None:
            self._close_release()
            self._reap(1.0)
        if self._status_fd is not None:
            os.close(self._status_fd)
            self._status_fd = None

    def _close_release(self) -> None:
        with self._lock:
            fd, self._release_fd = self._release_fd, None
        if fd is not None:
            os.close(fd)

    def _reap(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the child to end (it does at once when let go)."""
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)

    def poll(self) -> Optional[int]:
        """The exit code once the command has ended (128+N when killed by signal N)."""
        if self.exit_status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: its status is unknown
                self.exit_status = 255
                return self.exit_status
            if pid != 0:
                self.exit_status = exit_code(status)
        return self.exit_status

    def wait(self) -> int:
        """Wait for the command to end; its exit code."""
        if self.exit_status is None:
            try:
                _, status = os.waitpid(self.pid, 0)
                self.exit_status = exit_code(status)
            except ChildProcessError:
                self.exit_status = 255
        return self.exit_status


def _child(go_read: int, go_write: int, status_read: int, status_write: int, mask,
           argv: Sequence[str]) -> None:
    """In the child, every signal blocked: set the dispositions a shell would give, wait for
    the go byte, restore the mask and exec `argv`; never returns. Exit codes as a shell's:
    126 found but not runnable, 127 not found; HELD_EXIT when let go without a release."""
    code = 127
    try:
        os.close(go_write)
        os.close(status_read)
        _default_dispositions()
        if os.read(go_read, 1) != b"g":
            code = HELD_EXIT
            return
        os.close(go_read)
        restore_memlock_limit()  # (raised for 5.10's BPF objects: not the program's)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a pending signal acts now
        os.execvp(argv[0], list(argv))
    except OSError as err:
        code = 127 if err.errno in (errno.ENOENT, errno.ENOTDIR) else 126
        try:
            os.write(status_write, str(err.errno or 0).encode())
        except OSError:
            pass
    except BaseException:  # nothing of the tracer may run on in the child
        pass
    finally:
        os._exit(code)


def _default_dispositions() -> None:
    """Every signal with a Python handler back to its default action, and the signals
    Python ignores for itself; those ignored when this process started stay ignored."""
    for signum in sorted(_all_signals()):
        try:
            handler = signal.getsignal(signum)
            if callable(handler) or signum in _PYTHON_IGNORES:
                signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass


def exit_code(status: int) -> int:
    """A wait status as a shell gives it: the exit code, or 128+N when killed by signal N."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def alive(pid: int) -> bool:
    """True while process `pid` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return os.path.exists("/proc/%d" % pid) and not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:  # bytes: a comm may be any bytes
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False
