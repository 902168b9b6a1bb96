"""The stop signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT), in the two ways the commands take
them: trace's, blocked from the first moment and taken by a thread of their own (`stopper`);
the monitor's, Python handlers (`MonitorSignals`). Report keeps Python's own."""
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, List, Optional

from ..errors import Interrupted
from .common import say

if TYPE_CHECKING:
    from ..tracer import Tracer


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Stopper:
    """SIGINT, SIGTERM, SIGHUP and SIGQUIT, blocked in every thread from the first moment
    and taken by a thread of their own (sigwait), so that no exception ever lands in the
    middle of the tracer's work (a signal ignored when the tracer started stays ignored,
    for the command too, as in a shell):

    - while starting, before the command runs: the command is cancelled (it never runs)
      and the start ends at its next step (`checkpoint`) with `Interrupted`; a start that
      does not get there within START_GRACE_S, or a second signal, ends the process at once
      (the kernel frees the probes, the held child exits when its pipe closes);
    - with a command that runs: passed on to it (once it has exec'd); the tracer reads
      until it ends, then drains the ring, writes the reports and exits with its status;
    - without one (-d PID, system-wide), or once the command has ended: stop after
      draining, then the reports;
    - once the reading is over, while spooled lines are still written: stop writing them
      (what is left is counted as lost)."""

    def __init__(self) -> None:
        self.tracer: Optional["Tracer"] = None
        self.spool = None
        self.received: List[int] = []
        self.installed = False
        self.interrupted: Optional[int] = None  # the signal that cancelled the start
        self.pid = 0
        self._said = threading.Lock()  # one "interrupted" line, by whoever says it first

    def install(self) -> None:
        """Block the stop signals (threads started later inherit that) and take them in a
        thread; the commands get the mask the tracer was started with."""
        from ..targets import command

        self.pid = os.getpid()
        wanted = [s for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
        before = signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
        if command.commands_mask() is None:  # (python -m ebpf_cuda gave it already)
            command.give_commands_mask(before)
        for signum in wanted:  # (a thread that does not block them, if any, hands them on)
            signal.signal(signum, self._handler)
        threading.Thread(target=self._wait, args=(wanted,), name="ebpf-cuda signals",
                         daemon=True).start()
        self.installed = True

    def _wait(self, wanted: List[int]) -> None:
        while True:
            self.on_signal(signal.sigwait(wanted))

    def _handler(self, signum: int, frame) -> None:
        self.on_signal(signum)

    def on_signal(self, signum: int) -> None:
        if os.getpid() != self.pid:  # a helper child forked by the tracer: the tracer decides
            return
        self.received.append(signum)
        spool = self.spool
        if spool is not None and spool.closed:
            spool.abandon()
            return
        tracer = self.tracer
        if tracer is not None and not tracer.command:  # -d PID, system-wide
            tracer.stop()
            return
        command = tracer.session.command if tracer is not None else None
        if command is not None and not command.cancel():  # it runs: the signal is its
            if not command.signal(signum):
                tracer.stop()
            return
        if self.interrupted is not None:  # a second one while starting: at once
            self.force(signum)
        self.interrupted = signum
        if tracer is not None:
            tracer.stop()
        timer = threading.Timer(START_GRACE_S, self.force, args=(signum,))
        timer.daemon = True
        timer.start()

    def checkpoint(self) -> None:
        """Between the steps of the start: Interrupted when a stop signal came."""
        if self.interrupted is not None:
            raise Interrupted(self.interrupted)

    def say_interrupted(self, signum: int) -> bool:
        """The one line of an interrupted start (False when it was said already)."""
        if not self._said.acquire(blocking=False):
            return False
        tracer = self.tracer
        say("interrupted by %s%s" % (
            signal_name(signum),
            " while starting: %s was not run" % tracer.command[0]
            if tracer is not None and tracer.command
            else " while starting" if self.installed else ""))
        return True

    def force(self, signum: int) -> None:
        """End the process now (the start did not unwind in time, or a second signal)."""
        self.say_interrupted(signum)
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os._exit(128 + signum)


START_GRACE_S = 3.0  # how long an interrupted start may take to unwind before it is cut


stopper = Stopper()


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "signal %d" % signum


class MonitorSignals:
    """Stop signals: while starting, unwind (Interrupted); once running, stop after
    draining. SIGUSR1: a flight-recorder dump (ignored without one)."""

    def __init__(self) -> None:
        self.monitor = None  # the Monitor, once made
        self.running = False

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, self.stop)
        signal.signal(signal.SIGUSR1, self.dump)

    def stop(self, signum: int, frame) -> None:
        if not self.running or self.monitor is None:
            raise Interrupted(signum)
        self.monitor.stop()

    def dump(self, signum: int, frame) -> None:
        monitor = self.monitor
        if monitor is not None and monitor.flight is not None:
            monitor.flight.request("SIGUSR1")


def unblock_stop_signals() -> None:
    """The mask `python -m ebpf_cuda` started with (it blocks the stop signals first)."""
    from ..targets import command

    mask = command.commands_mask()
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def quiet() -> None:
    """Stop signals from here on end nothing more (the tracer is on its way out)."""
    for signum in STOP_SIGNALS:
        try:
            if signal.getsignal(signum) not in (signal.SIG_IGN, signal.SIG_DFL, None):
                signal.signal(signum, signal.SIG_IGN)
        except (OSError, ValueError):
            pass
