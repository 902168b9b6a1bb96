"""The `ebpf-cuda` command: click options → a `Tracer` and an output. Only this module prints,
exits or installs signal handlers."""
import errno
import functools
import os
import signal
import sys
import threading
from typing import List, Optional, Sequence, Set, Tuple

import click

from ..spec import apis
from ..monitor import heap
from ..output import plan
from ..errors import Interrupted, KernelError, TracerError, UsageError, VerifierError
from ..tracer import DEFAULT_RING_SIZE, Closing, Tracer


def _split_functions(value: Optional[str]) -> Optional[List[str]]:
    if not value:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


def _log(verbose: int):
    def log(message: str) -> None:
        if verbose:
            _echo(message)
    return log


def _say(message: str) -> None:
    """One line of ours on stderr (`ebpf-cuda: ...`)."""
    _echo("ebpf-cuda: %s" % message)


def _echo(text: str) -> None:
    """Text on stderr; a stderr that cannot be written (a terminal hung up) is no error."""
    try:
        click.echo(text, err=True)
    except (OSError, ValueError):
        pass


def _print(text: str, err: bool = False) -> bool:
    """A report on stdout (or stderr); False, said in one line, when it cannot be written."""
    if not err and 1 in _CLOSED_AT_START:
        _say("stdout is closed: the reports are not printed")
        return False
    try:
        click.echo(text, err=err)
        if not err:
            sys.stdout.flush()
        return True
    except OSError as error:
        _drop_stdout_buffer()
        if error.errno != errno.EPIPE:  # a reader that went away: as any filter, silent
            _say("cannot write to %s: %s" % ("stderr" if err else "stdout",
                                             error.strerror or error))
        return False


def _drop_stdout_buffer() -> None:
    """stdout failed: what it still buffers goes to /dev/null (the interpreter's last flush
    would otherwise fail too, and print a traceback of its own)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        os.dup2(null, 1, inheritable=False)
        os.close(null)
        sys.stdout.flush()
    except (OSError, ValueError, AttributeError):
        pass


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True,
              help="Say which files and offsets are probed (-vv: also the programs).")
@click.option("-t", "--no-timestamps", is_flag=True, help="Leave the time column out.")
@click.option("-r", "--no-returns", is_flag=True,
              help="Entry probes only: no return probes are attached, no [EXIT] lines.")
@click.option("-p", "--path", "paths", multiple=True, metavar="PATH",
              help="Library or executable to probe (repeatable). Default: found automatically.")
@click.option("-d", "--pid", type=int, help="Trace only this process (filtered in the kernel).")
@click.option("--functions", metavar="NAME,...",
              help="Functions to trace, by name or glob (default: the default set).")
@click.option("--all", "everything", is_flag=True,
              help="Trace every function of the table, also the chatty ones left out by "
                   "default (cudaGetDevice, cudaGetLastError, ...).")
@click.option("--api", type=click.Choice(["runtime", "driver", "nccl", "all"]), default="all",
              show_default=True,
              help="Which layer to trace (all: NCCL too, where a libnccl is found).")
@click.option("--no-follow", is_flag=True,
              help="With a command: trace only its own process (filtered in the kernel), "
                   "not the processes it starts.")
@click.option("--json", "as_json", is_flag=True, help="JSON Lines, one object per event.")
@click.option("-o", "--output", metavar="FILE", help="Write events to FILE instead of stdout.")
@click.option("--ring-size", metavar="SIZE",
              help="Ring buffer size (power of two, e.g. 256K, 8M; default 4M, or 8M with "
                   "--summary alone, whose records come in bursts: kernel registrations, "
                   "captures).")
@click.option("--spool-size", metavar="SIZE",
              help="Text and JSON: how much backlog may wait on disk (an unlinked file beside "
                   "the output, or in $TMPDIR) while lines are written slower than calls come; "
                   "past it, events are dropped and counted. Default 2G; 0: none, lines are "
                   "written as the ring buffer is read.")
@click.option("--entries", is_flag=True,
              help="Also emit each call's entry as it happens (for calls that block).")
@click.option("--list-functions", is_flag=True, help="List the traceable functions and exit.")
@click.option("--summary", is_flag=True,
              help="At the end, print summary tables (nsys stats style): time per function, "
                   "memory operations, copy bandwidth, errors, kernels. Without --json or -o, "
                   "no per-event lines.")
@click.option("--by-device", is_flag=True,
              help="With --summary: the tables once per GPU, each call under the device it "
                   "targets (its thread's current device; JSON events carry it as `device`).")
@click.option("--by-container", is_flag=True,
              help="With --summary: the tables once per container (JSON: `container`).")
@click.option("--leaks", is_flag=True,
              help="Flag double frees and frees of unknown pointers as they happen; at the "
                   "end, list the allocations never freed.")
@click.option("--stacks", is_flag=True,
              help="Capture the user call stack of memory calls (--leaks shows where each "
                   "leak was allocated).")
@click.option("--py-stacks", is_flag=True,
              help="Each call carries its thread's Python stack (file, executing line, "
                   "function), walked by the probe: JSON `py_stack`, ` at FILE:LINE (FUNCTION)` "
                   "on text lines, a summary table by Python line. CPython 3.8-3.14.")
@click.option("--save", metavar="FILE",
              help="Record the raw trace to FILE, for `ebpf-cuda report FILE` later.")
@click.option("--trace-out", metavar="FILE.json",
              help="Write a timeline in Chrome trace format (open in Perfetto UI).")
@click.option("--report", "report_html", metavar="FILE.html",
              help="Write a self-contained HTML report (tables and plots).")
@click.option("--pprof-out", metavar="FILE",
              help="Write a pprof profile (gzipped profile.proto: go tool pprof, Pyroscope, "
                   "Parca) of calls, API time, launches, bytes allocated and copied, by "
                   "function, kernel and, with --stacks, caller.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def trace(verbose: int, no_timestamps: bool, no_returns: bool, paths: Tuple[str, ...],
          pid: Optional[int], functions: Optional[str], everything: bool, api: str,
          no_follow: bool, as_json: bool, output: Optional[str],
          ring_size: Optional[str], spool_size: Optional[str], entries: bool,
          list_functions: bool, summary: bool, by_device: bool, by_container: bool,
          leaks: bool, stacks: bool, py_stacks: bool,
          save: Optional[str], trace_out: Optional[str],
          report_html: Optional[str], pprof_out: Optional[str],
          command: Tuple[str, ...]) -> None:
    """Trace the CUDA calls of a program: ebpf-cuda [OPTIONS] [-- COMMAND [ARGS...]]"""
    if list_functions:
        rows = ["%-32s %-8s %s" % (row.name, row.library, "with --all" if not row.default
                                   else "default*" if apis.driver_replaces(row)
                                   else "default") for row in apis.TABLE]
        rows.append("* not when the driver's launch functions are probed too: the driver sees "
                    "every launch")
        if not _print("\n".join(rows)):
            sys.exit(1)
        return
    _check_split(summary, by_device, by_container)
    request = plan.Request(output, as_json, not no_timestamps, summary, leaks, stacks, save,
                           trace_out, report_html, pprof_out, spool_size, no_returns,
                           1 in _CLOSED_AT_START, by_device, by_container, py_stacks)
    in_kernel = request.summary_only() and not no_returns  # the kernel sums the calls up
    _stopper.checkpoint()
    if pid is not None:
        _check_process_id(pid)
    tracer = Tracer(functions=_split_functions(functions), library=list(paths), pid=pid,
                    command=list(command), api=api, everything=everything,
                    follow_children=not no_follow, return_probes=not no_returns, entries=entries,
                    ring_size=plan.ring_size(ring_size, in_kernel, DEFAULT_RING_SIZE),
                    stacks=stacks, aggregate=in_kernel, emit=not in_kernel, log=_log(verbose),
                    py_stacks=py_stacks)
    _stopper.tracer = tracer
    _stopper.checkpoint()
    # Nothing is opened for writing before every output is known to be a file of its own.
    plan.refuse_same_files(request.files(), plan.trace_inputs(paths, command))
    outputs = plan.for_trace(request, tracer, warn=_say)
    _stopper.spool = outputs.spool
    with tracer:
        _stopper.checkpoint()  # (from here on a stop signal cancels a command held)
        _report_start(tracer, verbose)
        tracer.trace_into(outputs.sinks, save=outputs.saver, spool=outputs.spool,
                          reader_nice=READER_NICE, notice=_say)
        _stopper.checkpoint()  # a command cancelled before it ran
        reports = outputs.reports(tracer)
        closing = tracer.closing()
        tracer.close(wait=False)  # this process exits now: a child detaches the probes
    _finish(closing, reports, request.reports_to_stderr(), summary)


def _finish(closing: Closing, reports: List[str], reports_err: bool, summary: bool) -> None:
    """The end of a live trace: what the tracer tells (Tracer.closing) around the reports,
    and the exit code (the command's when it ran; 1 when an output failed without one)."""
    for line in closing.left_running:
        _say(line)
    losses = closing.losses
    if reports and summary and losses.read().total:  # the summary says what it did not see
        reports[0] += "\n\n" + plan.summary_losses(losses.read())
    printed = _print("\n\n".join(reports), err=reports_err) if reports else True
    for line in closing.lines:
        _say(line)
    if closing.exit_status is not None:
        sys.exit(closing.exit_status)
    if not printed:
        sys.exit(1)


READER_NICE = -10  # the CPU weight of ~9 ordinary threads (sched_prio_to_weight): a program
# with more busy threads than cores cannot starve the reader (the lines thread inherits it)


def _report_start(tracer: Tracer, verbose: int) -> None:
    files = sorted({a.path for a in tracer.attachments})
    _say("probing %d functions in %s" % (len({a.api for a in tracer.attachments}),
                                         ", ".join(files)))
    for failure in tracer.failures:
        _say("warning: %s" % failure)
    if verbose >= 2:  # each program once, with the functions that share it
        users: dict = {}
        for (name, retprobe), program in tracer.programs.items():
            users.setdefault(id(program), (program, retprobe, []))[2].append(name)
        for program, retprobe, names in users.values():
            _echo("-- %s %s (%s) --\n%s" % (program.name, "return" if retprobe else "entry",
                                            ", ".join(names), program.disassembly()))


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class _Stopper:
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
        self.tracer: Optional[Tracer] = None
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
        _say("interrupted by %s%s" % (
            _signal_name(signum),
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


_stopper = _Stopper()


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "signal %d" % signum


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", metavar="FILE...", nargs=-1, required=True)
@click.option("--collectives", is_flag=True,
              help="Merge the NCCL collectives of the ranks in the FILEs (the default with "
                   "several): ranks that never entered one, arrival spread, mismatches.")
@click.option("-t", "--no-timestamps", is_flag=True, help="Leave the time column out.")
@click.option("--json", "as_json", is_flag=True, help="JSON Lines, one object per event.")
@click.option("-o", "--output", metavar="FILE", help="Write events to FILE instead of stdout.")
@click.option("--summary", is_flag=True, help="Print the summary tables.")
@click.option("--by-device", is_flag=True, help="With --summary: the tables once per GPU.")
@click.option("--by-container", is_flag=True,
              help="With --summary: the tables once per container (known live only).")
@click.option("--leaks", is_flag=True, help="Flag double frees; list allocations never freed.")
@click.option("--trace-out", metavar="FILE.json", help="Write a Chrome trace timeline.")
@click.option("--report", "report_html", metavar="FILE.html", help="Write an HTML report.")
def report_cmd(paths: Tuple[str, ...], collectives: bool, no_timestamps: bool, as_json: bool,
               output: Optional[str], summary: bool, by_device: bool, by_container: bool,
               leaks: bool,
               trace_out: Optional[str], report_html: Optional[str]) -> None:
    """Outputs of a trace saved with --save: ebpf-cuda report FILE [OPTIONS]; with several
    FILEs (the ranks of one job), their NCCL collectives merged. Needs no privileges; kernel
    names are those known when tracing."""
    from ..output import savefile

    if collectives or len(paths) > 1:
        return _collectives_report(paths, [("-t", no_timestamps), ("--json", as_json),
                                           ("-o", output), ("--summary", summary),
                                           ("--leaks", leaks), ("--trace-out", trace_out),
                                           ("--report", report_html),
                                           ("--by-device", by_device),
                                           ("--by-container", by_container)])
    _check_split(summary, by_device, by_container)
    path = paths[0]

    request = plan.Request(output, as_json, not no_timestamps, summary, leaks,
                           trace_out=trace_out, report_html=report_html,
                           stdout_closed=1 in _CLOSED_AT_START, by_device=by_device,
                           by_container=by_container)
    plan.refuse_same_files(request.files(), [("the input trace", path)])
    saved = savefile.load(path)
    from ..monitor.flight import describe, read_trigger  # a flight-recorder dump names its trigger

    trigger = read_trigger(path)
    if trigger is not None:
        _say("flight-recorder dump: %s; the %gs before it" % (describe(trigger),
                                                             trigger.get("window_s", 0)))
    made = plan.for_replay(request, saved, warn=_say)
    outputs, losses, graphs = plan.replay(saved, made.sinks, notice=_say)
    reports = made.reports()
    if reports and summary and losses.total:
        reports[0] += "\n\n" + plan.summary_losses(losses)
    printed = _print("\n\n".join(reports), err=request.reports_to_stderr()) if reports \
        else True  # as live
    if graphs.unknown_summary():
        _say(graphs.unknown_summary())
    incomplete = saved.incomplete()
    if incomplete:  # what is known to be missing, the noted losses with it
        _say(incomplete)
    elif losses.sentence():  # the line the live run printed
        _say(losses.sentence())
    if outputs.failures or not printed:
        sys.exit(1)


def _check_split(summary: bool, by_device: bool, by_container: bool) -> None:
    for given, option in ((by_device, "--by-device"), (by_container, "--by-container")):
        if given and not summary:
            raise UsageError("%s splits the summary: give --summary too" % option)


def _check_process_id(pid: int) -> None:
    """-d takes a process: a thread's id is refused with its process's id."""
    from ..errors import ProcessError

    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            status = f.read()
    except (OSError, OverflowError):
        return  # the tracer's own check says what is wrong with it
    for line in status.splitlines():
        if line.startswith(b"Tgid:"):
            tgid = int(line.split()[1])
            if tgid != pid:
                raise ProcessError("%d is a thread of process %d: -d takes a process id "
                                   "(-d %d traces all its threads)" % (pid, tgid, tgid))
            return


_CLOSED_AT_START: Set[int] = set()  # standard descriptors closed when we were started


def _standard_fds() -> Set[int]:
    """Put /dev/null on the standard descriptors that are closed, so that no file we open
    takes their number (the command would write into our trace). Close-on-exec: the command
    gets them closed, as a shell would give them. The ones that were closed."""
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
    return closed


def _collectives_report(paths: Sequence[str], options: Sequence[Tuple[str, object]]) -> None:
    """`report FILE...`: the NCCL collectives of the ranks saved in the FILEs, merged (the
    logic: analysis/collectives.py)."""
    given = [name for name, value in options if value]
    if given:
        raise UsageError("%s: with several FILEs (or --collectives) report merges their NCCL "
                         "collectives; the other outputs take one FILE" % ", ".join(given))
    from ..analysis.collectives import merge_report
    from ..output.savefile import load

    if not _print(merge_report(paths, [load(path) for path in paths])):
        sys.exit(1)


# -- ebpf-cuda monitor -----------------------------------------------------------------------

class _MonitorSignals:
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


MIN_FLIGHT_SIZE = 1 << 20
MAX_SECONDS = 366 * 86400.0  # (a longer wait overflows a timeout's time_t: a year will do)


def _positive_seconds(value: Optional[float], option: str) -> Optional[float]:
    """`value`, when it is a positive number of seconds (not nan, not inf) up to a year."""
    if value is not None and not 0 < value <= MAX_SECONDS:
        raise UsageError("%s takes a positive number of seconds up to a year, not %g"
                         % (option, value))
    return value


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="Say which files and offsets are probed.")
@click.option("-p", "--path", "paths", multiple=True, metavar="PATH",
              help="Library or executable to probe (repeatable). Default: every CUDA runtime "
                   "and driver file found, and those running processes map.")
@click.option("--functions", metavar="NAME,...", help="Functions to count (default set).")
@click.option("--all", "everything", is_flag=True, help="Every function of the table.")
@click.option("--api", type=click.Choice(["runtime", "driver", "all"]), default="all",
              show_default=True, help="Which layer to count.")
@click.option("--prometheus", metavar="HOST:PORT",
              help="Serve /metrics (Prometheus text format) there; HOST defaults to "
                   "127.0.0.1. Anyone who can reach it reads process and kernel names.")
@click.option("--kernel-labels", type=click.IntRange(min=0),
              default=20,  # (monitor.DEFAULT_KERNEL_LABELS)
              show_default=True,
              help="Kernel names per process given a label of their own (the first ones "
                   "it launches); the rest count as kernel=\"other\". 0: none.")
@click.option("--otlp", metavar="URL",
              help="Push the metrics as OTLP/HTTP JSON to URL (an OpenTelemetry collector's "
                   "http://HOST:4318; /v1/metrics is added when URL has no path).")
@click.option("--interval", type=float, default=15.0, show_default=True,
              metavar="SECONDS", help="How often --otlp pushes.")
@click.option("--pprof-out", metavar="FILE",
              help="At the end, write a pprof profile (gzipped profile.proto) of calls, API "
                   "time, launches, bytes allocated and copied, by function and kernel.")
@click.option("--flight-recorder", type=float, metavar="SECONDS",
              help="Keep every call of the last SECONDS on disk; write them as a saved "
                   "trace into --flight-dir when a trigger fires (every call then travels "
                   "the ring buffer: costlier than counting alone).")
@click.option("--flight-dir", default=".", show_default=True, metavar="DIR",
              help="Where the flight recorder keeps its ring and writes its dumps.")
@click.option("--flight-size", metavar="SIZE", default="1G", show_default=True,
              help="How much disk the flight recorder's ring may take.")
@click.option("--trigger-error", metavar="CODES", default="oom,illegal-address",
              show_default=True,
              help="Error returns that trigger a dump: families (oom, illegal-address), "
                   "numbers or names (cudaErrorLaunchFailure); none: no error triggers.")
@click.option("--trigger-latency", type=float, metavar="SECONDS",
              help="A synchronising call (cudaDeviceSynchronize, cuStreamSynchronize, ...) "
                   "at least this long triggers a dump.")
@click.option("--ring-size", metavar="SIZE",
              help="Ring buffer size (default 4M, 16M with --flight-recorder).")
@click.option("--return-sampling", type=click.IntRange(min=1), metavar="N",
              default=64,  # (monitor.DEFAULT_SAMPLE_RETURNS)
              show_default=True,
              help="Kernel launches: take the return of 1 call in N (a power of two; "
                   "kernels with uprobe sessions, 6.13+): durations and errors of launches "
                   "are then sampled, their counts stay exact, and a launch costs no return "
                   "probe. 1: every return; at most 1048576.")
def monitor_cmd(verbose: int, paths: Tuple[str, ...], functions: Optional[str],
                everything: bool, api: str, prometheus: Optional[str], kernel_labels: int,
                otlp: Optional[str], interval: float, pprof_out: Optional[str],
                flight_recorder: Optional[float], flight_dir: str, flight_size: str,
                trigger_error: str, trigger_latency: Optional[float],
                ring_size: Optional[str], return_sampling: int) -> None:
    """Count the CUDA calls of every process of this machine until stopped (SIGINT,
    SIGTERM): ebpf-cuda monitor [--prometheus HOST:PORT] [--otlp URL] [...]"""
    signals = _MonitorSignals()
    signals.install()  # first: a stop signal while starting unwinds what was set up
    from ..monitor.agent import Monitor, MonitorOptions
    from ..monitor.prometheus import parse_address

    address = parse_address(prometheus) if prometheus else None
    _positive_seconds(interval, "--interval")
    flight = _monitor_flight(flight_recorder, flight_dir, flight_size, trigger_error,
                             _positive_seconds(trigger_latency, "--trigger-latency"))
    from ..session import MAX_SAMPLE_RETURNS

    if return_sampling & (return_sampling - 1):
        raise UsageError("--return-sampling takes a power of two, not %d" % return_sampling)
    if return_sampling > MAX_SAMPLE_RETURNS:
        raise UsageError("--return-sampling takes at most %d, not %d"
                         % (MAX_SAMPLE_RETURNS, return_sampling))
    options = MonitorOptions(tuple(paths), tuple(_split_functions(functions) or ()) or None,
                             api, everything, kernel_labels,
                             plan.parse_size(ring_size) if ring_size else None, flight,
                             sample_returns=return_sampling)
    heap.for_long_runs()  # (an always-on process: large buffers unmapped when freed)
    monitor = signals.monitor = Monitor(options, log=_say if verbose else None, notice=_say)
    # What can fail does before the probes go on: the port is bound, the URL and the
    # profile's file checked.
    exporters = _monitor_exporters(monitor, address, otlp, interval)
    profile = plan.open_binary(pprof_out) if pprof_out else None
    written = True
    try:
        monitor.start()
        _say("monitoring %d functions in %s" % (len(monitor.functions),
                                                ", ".join(monitor.files)))
        sampled = monitor.tracer.sampled_returns()
        if sampled:
            _say("returns sampled, 1 call in %d (uprobe sessions): %s"
                 % (return_sampling, " ".join(sampled)))
        for exporter, where in exporters:
            exporter.start()
            _say(where)
        signals.running = True
        monitor.run()
        if profile is not None:
            written = _monitor_profile(monitor, profile, pprof_out)
    finally:
        signals.running = False
        for exporter, _ in exporters:
            exporter.close()
        monitor.close()
        if profile is not None:
            profile.close()
    _say("stopped: %d processes seen%s" % (
        monitor.seen, "; %d flight-recorder dumps" % len(monitor.flight.paths)
        if monitor.flight is not None else ""))
    if not written:
        sys.exit(1)


def _monitor_flight(seconds: Optional[float], directory: str, size: str, errors: str,
                    latency: Optional[float]):
    if seconds is None:
        return None
    from ..monitor.flight import FlightOptions, parse_trigger_errors

    _positive_seconds(seconds, "--flight-recorder")
    if not os.path.isdir(directory):
        raise UsageError("--flight-dir %s is not a folder" % directory)
    ring = plan.parse_size(size)
    if ring < MIN_FLIGHT_SIZE:  # (a smaller ring keeps no batch of a busy second)
        raise UsageError("--flight-size takes at least 1M, not %s" % size)
    return FlightOptions(seconds, directory, parse_trigger_errors(errors),
                         int(latency * 1e9) if latency is not None else None, ring)


def _monitor_exporters(monitor, address, otlp: Optional[str], interval: float) -> List:
    """(exporter, where it goes in words) of --prometheus and --otlp, not started yet."""
    exporters: List = []
    if address is not None:
        from ..monitor.prometheus import MetricsServer

        monitor.add_exporter("prometheus")
        server = MetricsServer(address, functools.partial(monitor.collect, "prometheus"))
        host, port = server.address
        exporters.append((server, "metrics at http://%s:%d/metrics"
                          % ("[%s]" % host if ":" in host else host, port)))
    if otlp:
        from ..monitor.otlp import OtlpPusher

        monitor.add_exporter("otlp")
        pusher = OtlpPusher(otlp, interval, functools.partial(monitor.collect, "otlp"),
                            monitor.started_at, on_error=_say)
        exporters.append((pusher, "pushing metrics to %s every %gs" % (pusher.url, interval)))
    return exporters


def _monitor_profile(monitor, stream, path: str) -> bool:
    """The run's pprof profile written; False (said in one line) when it cannot be."""
    from ..output import pprof

    try:
        stream.write(pprof.profile_of_monitor(monitor.collect("pprof"), monitor.launch_totals(),
                                              monitor.started_at))
        stream.flush()
    except OSError as err:
        _say("cannot write %s: %s" % (path, err.strerror or err))
        return False
    _say("pprof profile written to %s" % path)
    return True


def main(argv: Optional[List[str]] = None) -> None:
    """Entry point of the console script: errors become one line and an exit code (it
    returns when that is 0)."""
    code = _flush_stdout(_main(argv))
    if code:
        sys.exit(code)


def _main(argv: Optional[List[str]]) -> int:
    """The exit code of a run."""
    global _CLOSED_AT_START
    _CLOSED_AT_START = _standard_fds()
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        if args[:1] in (["report"], ["monitor"]):  # (their signals: Python's, or their own)
            _unblock_stop_signals()
        if args[:1] == ["report"]:
            report_cmd.main(args=args[1:], prog_name="ebpf-cuda report", standalone_mode=False)
        elif args[:1] == ["monitor"]:  # (its own signal handling: _MonitorSignals)
            monitor_cmd.main(args=args[1:], prog_name="ebpf-cuda monitor",
                             standalone_mode=False)
        else:
            _stopper.install()  # first: a signal from now on is handled
            trace.main(args=args, prog_name="ebpf-cuda", standalone_mode=False)
        return 0
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except Interrupted as err:
        _quiet()
        _stopper.say_interrupted(err.signum)
        return 128 + err.signum
    except KeyboardInterrupt:
        _quiet()
        _say("interrupted")
        return 130
    except click.exceptions.Abort:
        return 130
    except click.ClickException as err:
        err.show()
        return UsageError.exit_code
    except VerifierError as err:
        if err.errno in (errno.EMFILE, errno.ENFILE):  # not the verifier's doing
            _say(_too_many_files("loading the eBPF programs"))
            return KernelError.exit_code
        _say(str(err))
        if "-v" in args or "--verbose" in args:
            lines = [line for line in err.log.splitlines() if line.strip()][-15:]
            _echo("\n".join(lines))
        return err.exit_code
    except TracerError as err:
        if isinstance(err, KernelError) and err.errno in (errno.EMFILE, errno.ENFILE):
            _say(_too_many_files(err))
        else:
            _say(str(err) + _kernel_hint(err))
        return err.exit_code
    except OSError as err:  # what no layer turned into a sentence: still one line
        if err.errno in (errno.EMFILE, errno.ENFILE):
            _say(_too_many_files(err.strerror))
            return KernelError.exit_code
        else:
            _say("%s%s" % (err.strerror or err, ": %s" % err.filename if err.filename else ""))
        return 1


STACK_DEPTH = 127  # frames of the --stacks map (maps.StackTraceMap's depth)


def _kernel_hint(err: TracerError) -> str:
    """What a bare kernel errno means here, when it is known ("" otherwise)."""
    if isinstance(err, KernelError) and err.errno == errno.EINVAL and "'stacks'" in str(err):
        try:
            with open("/proc/sys/kernel/perf_event_max_stack") as f:
                most = int(f.read())
        except (OSError, ValueError):
            return ""
        if most < STACK_DEPTH:
            return (" (--stacks needs %d frames, and kernel.perf_event_max_stack is %d: "
                    "raise it with sysctl, or trace without --stacks)" % (STACK_DEPTH, most))
    return ""


def _too_many_files(err) -> str:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return ("too many open files (the limit is %d; raise it with ulimit -n): %s"
            % (soft, err))


def _unblock_stop_signals() -> None:
    """The mask `python -m ebpf_cuda` started with (it blocks the stop signals first)."""
    from ..targets import command

    mask = command.commands_mask()
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _quiet() -> None:
    """Stop signals from here on end nothing more (the tracer is on its way out)."""
    for signum in STOP_SIGNALS:
        try:
            if signal.getsignal(signum) not in (signal.SIG_IGN, signal.SIG_DFL, None):
                signal.signal(signum, signal.SIG_IGN)
        except (OSError, ValueError):
            pass


def _flush_stdout(code: int) -> int:
    """Whatever stdout still holds, written now: a failure is one line (and exit code 1
    unless there is already one), never the interpreter's traceback at exit."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except OSError as err:
        _drop_stdout_buffer()
        if err.errno != errno.EPIPE:  # a reader that went away: as any filter, silent
            _say("cannot write to stdout: %s" % (err.strerror or err))
        return code or 1
    except ValueError:
        pass
    return code
