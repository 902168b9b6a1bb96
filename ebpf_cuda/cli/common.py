"""What the commands share: the lines we write on stderr, the reports on stdout, the standard
descriptors found closed at start, and the checks of options more than one command takes."""
import codecs
import errno
import io
import os
import sys
from typing import List, Optional, Set

from ..errors import UsageError


def say(message: str) -> None:
    """One line of ours on stderr (`ebpf-cuda: ...`)."""
    echo("ebpf-cuda: %s" % message)


def echo(text: str) -> None:
    """Text on stderr; a stderr that cannot be written (a terminal hung up) is no error."""
    try:
        write_line(text, err=True)
    except (OSError, ValueError):
        pass


def write_line(text: str, err: bool = False) -> None:
    """`click.echo(text, err=err)`, without importing click where it writes the text as it is
    (a text stream with an encoding other than ASCII, and no escape sequence to strip)."""
    stream = sys.stderr if err else sys.stdout
    if stream is None:
        return
    if "\x1b" in text or not _plain_text_stream(stream):
        import click

        click.echo(text, err=err)
        return
    stream.write(text + "\n")
    stream.flush()


def _plain_text_stream(stream) -> bool:
    """A stream click's echo writes to as it is (click/_compat.py: not ASCII, with its
    encoding and errors set)."""
    if not isinstance(stream, io.TextIOWrapper) or not stream.encoding or not stream.errors:
        return False
    try:
        return codecs.lookup(stream.encoding).name != "ascii"
    except LookupError:
        return True


def print_report(text: str, err: bool = False) -> bool:
    """A report on stdout (or stderr); False, said in one line, when it cannot be written."""
    if not err and stdout_closed_at_start():
        say("stdout is closed: the reports are not printed")
        return False
    try:
        write_line(text, err=err)
        if not err:
            sys.stdout.flush()
        return True
    except OSError as error:
        drop_stdout_buffer()
        if error.errno != errno.EPIPE:  # a reader that went away: as any filter, silent
            say("cannot write to %s: %s" % ("stderr" if err else "stdout",
                                            error.strerror or error))
        return False


def drop_stdout_buffer() -> None:
    """stdout failed: what it still buffers goes to /dev/null (the interpreter's last flush
    would otherwise fail too, and print a traceback of its own)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        os.dup2(null, 1, inheritable=False)
        os.close(null)
        sys.stdout.flush()
    except (OSError, ValueError, AttributeError):
        pass


_CLOSED_AT_START: Set[int] = set()  # standard descriptors closed when we were started


def stdout_closed_at_start() -> bool:
    return 1 in _CLOSED_AT_START


def take_standard_fds() -> None:
    """Put /dev/null on the standard descriptors that are closed, so that no file we open
    takes their number (the command would write into our trace). Close-on-exec: the command
    gets them closed, as a shell would give them. The ones that were closed are noted."""
    global _CLOSED_AT_START
    closed = set()
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
    for fd in sorted(closed):
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        if null != fd:
            os.dup2(null, fd, inheritable=False)
            os.close(null)
    if 1 in closed or sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)
    if 2 in closed or sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)
    for stream in (sys.stdout, sys.stderr):  # a name or path of any bytes never stops a report
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass
    _CLOSED_AT_START = closed


def split_functions(value: Optional[str]) -> Optional[List[str]]:
    """--functions NAME,...: the names, blanks left out (None when none is given)."""
    if not value:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


def check_split(summary: bool, by_device: bool, by_container: bool) -> None:
    """--by-device and --by-container split the summary: they need --summary."""
    for given, option in ((by_device, "--by-device"), (by_container, "--by-container")):
        if given and not summary:
            raise UsageError("%s splits the summary: give --summary too" % option)


def check_analyze(analyze: bool, step_at: Optional[str], no_returns: bool = False) -> None:
    """--step-at goes with --analyze; the analysis needs each call's return (its duration)."""
    if step_at is not None and not analyze:
        raise UsageError("--step-at names the step for --analyze: give --analyze too")
    if analyze and no_returns:
        raise UsageError("--analyze needs each call's duration: not with -r/--no-returns")


def parse_cpus(text: str) -> Set[int]:
    """`--cpu LIST` (`0`, `0,2`, `2-3`) as a set of CPUs this process may run on; a
    UsageError when it names none or one it may not use."""
    cpus: Set[int] = set()
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    except ValueError:
        raise UsageError("--cpu takes CPU numbers and ranges, such as 0 or 0,2-3: %r"
                         % text) from None
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise UsageError("--cpu %s: this process may run on CPUs %s only"
                         % (text, ",".join(str(c) for c in sorted(allowed))))
    return cpus


def pin_threads(cpus: Set[int]) -> None:
    """Every thread of this process (and the threads they start later) on `cpus`; a process
    forked before (the traced command) keeps its own CPUs."""
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cpus)
        except (ProcessLookupError, ValueError):  # (a thread that has just ended)
            pass
