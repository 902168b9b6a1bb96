"""The outputs of one trace: each sink dropped at its first write error, what it missed
counted, the person told once (`Outputs`); which sink can take lines straight from frames."""
import os
import sys
from typing import Callable, Dict, List, Optional, Sequence

from ..spec import record
from . import LineWriter

Notice = Callable[[str], None]


def lines_only(sinks: Sequence):
    """The text or JSON writer when it is the only sink (else None): it can then format
    lines from the frames without decoding them into events, and be spooled."""
    if len(sinks) == 1 and isinstance(sinks[0], LineWriter):
        return sinks[0]
    return None


def output_name(sink) -> str:
    """How a person knows an output: its `output_name` when the caller gave one, else its
    stream's name ("stdout", a path), else its class."""
    name = getattr(sink, "output_name", None)
    if name:
        return str(name)
    name = getattr(getattr(sink, "stream", None), "name", None)
    if isinstance(name, str) and name:
        return name.strip("<>") if name.startswith("<") else name
    if isinstance(name, int):
        return "file descriptor %d" % name
    return type(sink).__name__


class OutputFailure:
    """An output dropped at its first write error: `name`, `error` (the OSError),
    `unwritten` records it missed from the failing batch on."""

    def __init__(self, name: str, error: OSError) -> None:
        self.name = name
        self.error = error
        self.unwritten = 0
        self.by_reader = 0  # counted by the reader while the lines thread is done with it

    @property
    def total(self) -> int:
        return self.unwritten + self.by_reader

    @property
    def cause(self) -> str:
        return self.error.strerror or str(self.error) or type(self.error).__name__

    def __str__(self) -> str:
        return "cannot write %s: %s" % (self.name, self.cause)


class Outputs:
    """The outputs of one trace, each dropped at its first write error (see
    `Stream.deliver`). `goes_on`: the reading goes on when none is left (a command is
    traced to its end)."""

    def __init__(self, sinks: Sequence, notice: Optional[Notice] = None,
                 goes_on: bool = True) -> None:
        self.sinks = list(sinks)
        self.failures: List[OutputFailure] = []
        self._failed: Dict[int, OutputFailure] = {}
        self._notice = notice
        self._goes_on = goes_on

    def alive(self, sink) -> bool:
        return sink is not None and id(sink) not in self._failed

    def any_alive(self, sinks: Sequence) -> bool:
        return any(self.alive(sink) for sink in sinks)

    @property
    def nothing_left(self) -> bool:
        """True when every output has failed (none to write to)."""
        return bool(self.sinks) and not self.any_alive(self.sinks)

    def call(self, sink, method: Callable, *args) -> bool:
        """`method(*args)` of an output; False, and the output dropped, on a write error."""
        try:
            method(*args)
            return True
        except OSError as err:
            self.fail(sink, err)
            return False

    def fail(self, sink, err: OSError) -> None:
        if not self.alive(sink):
            return
        failure = OutputFailure(output_name(sink), err)
        self.failures.append(failure)
        self._failed[id(sink)] = failure
        _close_quietly(sink)
        if self._notice is not None:
            if not self.nothing_left:
                rest = "the other outputs go on"
            elif self._goes_on:
                rest = "nothing is written from here on, the command runs on traced to its end"
            else:
                rest = "nothing is left to write to: stopping"
            self._notice("%s (%s; what it misses is counted as lost)" % (failure, rest))

    def header(self) -> None:
        """Every output's header, flushed: it comes before what the command prints."""
        for sink in self.sinks:
            if self.alive(sink):
                self.call(sink, sink.header)
        self.flush()

    def flush(self) -> None:
        """A person watching sees each batch as it comes."""
        for sink in self.sinks:
            stream = getattr(sink, "stream", None)
            if stream is not None and self.alive(sink) and not getattr(stream, "closed", False):
                self.call(sink, stream.flush)

    def count(self, frames: bytes, by_reader: bool = False) -> None:
        """The records of a batch that the failed outputs miss."""
        if self.failures:
            calls = record.call_count(frames)
            for failure in self.failures:
                if by_reader:
                    failure.by_reader += calls
                else:
                    failure.unwritten += calls

    def close(self) -> None:
        """Close every output (a failure now is reported too; a failed one quietly)."""
        for sink in self.sinks:
            if self.alive(sink):
                self.call(sink, sink.close)


def _close_quietly(sink) -> None:
    """Let a failed output go: its file closed, what it still buffers thrown away (else
    the interpreter would try to write it again at exit)."""
    stream = getattr(sink, "stream", None)
    if stream is None or getattr(stream, "closed", True):
        return
    if stream in (sys.stdout, sys.stderr):
        _drop_buffered(stream)
        return
    try:
        stream.close()
    except (OSError, ValueError):
        _drop_buffered(stream)
        try:
            stream.close()
        except (OSError, ValueError):
            pass


def _drop_buffered(stream) -> None:
    """Point the stream's file descriptor at /dev/null so what it buffers goes nowhere."""
    try:
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.dup2(null, fd, inheritable=os.get_inheritable(fd))
        finally:
            os.close(null)
        stream.flush()
    except (OSError, ValueError, AttributeError):
        pass
