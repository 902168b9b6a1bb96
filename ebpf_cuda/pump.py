"""The ring kept drained while the reader is busy with one batch for long.

The reader names a batch's launches while their processes live. The first launch from a
large library has it scan that file's registrations and symbols (a framework's: seconds of
Python), and meanwhile a program launching flat out fills the 4 MiB ring in tens of
milliseconds: everything after that was lost (a PyTorch loop attached with `-d` lost
330,000 calls this way). So while the reader works on a batch, `Pump`'s thread looks every
PUMP_S: when the reader is still at the same batch, it moves the ring's records into a
spool (output/spool.py: 1 MiB in memory, then an unnamed file, page cache rather than the
tracer's memory), in order, and the reader takes them from there before it reads the ring
again. A batch handled in time costs the reader a lock and a flag; the thread sleeps while
the reader waits for records.

The pump takes the interpreter lock from the reader at most every switch interval, and
only between two bytecodes: the reader's long C calls (a regular expression over a string
table) are bounded in size for this (targets/elf_symbols.py reads 1 MiB at a time).
"""
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from .output.spool import Spool

PUMP_S = 0.005  # how long the reader may be at one batch before the pump takes the ring's
# records, and then how often it looks again (the 4 MiB ring holds ~25,000 records: 125 ms
# of a loop launching 200,000 kernels a second)
READS_A_TURN = 16  # batches taken at a look, at most (the reader waits for the turn)
PUMP_CAUSE = "the reader's overflow file"


class Pump:
    """Takes batches with `take()` (the ring's, one call's worth: `read`) into a spool while
    the reader is inside `busy()` for longer than PUMP_S; `frames()` gives the reader what
    the pump took first, then the ring's."""

    def __init__(self, read: Callable[[], bytes], directory: Optional[str] = None) -> None:
        self._read = read
        self._directory = directory
        self._spool: Optional[Spool] = None  # made at the first batch it takes
        self._turn = threading.Lock()  # the ring's one consumer at a time
        self._wake = threading.Condition()
        self._batch = 0  # batches the reader began
        self._busy = False  # the reader is at batch `_batch`
        self._broken = False  # no spool file could be made: the pump stays off
        self._closing = threading.Event()  # the thread is to end (stop()); wakes its waits
        self._thread: Optional[threading.Thread] = None

    def frames(self) -> bytes:
        """The oldest frames not read yet: those the pump took, else the ring's."""
        spool = self._spool
        if spool is not None and spool.waiting:
            return spool.take() or b""
        return self._read()

    @property
    def waiting(self) -> bool:
        """Whether the pump holds frames the reader has not taken."""
        return self._spool is not None and self._spool.waiting

    @contextmanager
    def busy(self) -> Iterator[None]:
        """The reader works on a batch: the pump may take the ring's records meanwhile."""
        if self._thread is None and not self._broken:
            self._thread = threading.Thread(target=self._run, name="ebpf-cuda pump",
                                            daemon=True)
            self._thread.start()
        with self._wake:
            self._batch += 1
            self._busy = True
            self._wake.notify()
        try:
            yield
        finally:
            with self._turn:  # (not while the pump reads the ring)
                self._busy = False

    @property
    def dropped(self) -> int:
        """Calls the spool could not keep (its limit, or the disk refused them)."""
        return self._spool.dropped if self._spool is not None else 0

    @property
    def error(self) -> Optional[str]:
        return self._spool.error if self._spool is not None else None

    def stop(self) -> None:
        """Stop the thread (at the end of a read loop: before the ring may be closed); what
        it took stays for `frames()`, and the next `busy()` starts it again."""
        with self._wake:
            self._closing.set()
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
        self._thread = None
        self._closing.clear()

    def __enter__(self) -> "Pump":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def discard(self) -> None:
        """Free the spool's file (the stream is done with; frames left in it are the
        reader's: a caller that stopped reading)."""
        if self._spool is not None:
            self._spool.discard()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._busy and not self._closing.is_set():
                    self._wake.wait()
                if self._closing.is_set():
                    return
                batch = self._batch
            self._closing.wait(PUMP_S)
            while self._take(batch):
                self._closing.wait(PUMP_S)

    def _take(self, batch: int) -> bool:
        """Move the ring's records to the spool while the reader is still at `batch`."""
        with self._turn:
            if not self._busy or self._batch != batch or self._closing.is_set():
                return False
            if self._spool is None:
                try:
                    self._spool = Spool(self._directory, memory=1 << 20)
                except OSError:  # (no file to be had: the ring keeps them, or loses them)
                    self._broken = True
                    return False
            for _ in range(READS_A_TURN):
                frames = self._read()
                if not frames:
                    break
                self._spool.put(frames)
        return True
