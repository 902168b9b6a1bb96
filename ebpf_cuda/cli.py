"""The `ebpf-cuda` command: click options → a `Tracer` and an output. Only this module prints,
exits or installs signal handlers."""
import errno
import os
import signal
import stat
import sys
from typing import IO, List, Optional, Sequence, Set, Tuple

import click

from . import apis
from .errors import KernelError, TracerError, UsageError, VerifierError
from .losses import Losses
from .names import KernelNamer
from .output import Sink
from .output.text import TextWriter
from .stream import Outputs, lines_only
from .tracer import DEFAULT_RING_SIZE, Tracer

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def format_size(size: int) -> str:
    """8388608 → `8M` (the largest unit that divides it)."""
    for unit in ("G", "M", "K"):
        if size and size % _UNITS[unit] == 0:
            return "%d%s" % (size // _UNITS[unit], unit)
    return str(size)


def parse_size(text: str) -> int:
    """`8M` → 8388608; plain numbers are bytes."""
    text = text.strip().upper().rstrip("B").rstrip("I")
    unit = text[-1:] if text[-1:] in _UNITS else ""
    number = text[:-1] if unit else text
    if not number.isdigit():
        raise UsageError("bad size %r (examples: 65536, 256K, 8M)" % text)
    return int(number) * _UNITS[unit]


SUMMARY_RING_SIZE = 1 << 20  # --summary alone: only calls that teach kernel names travel


MAX_RING_SIZE = 1 << 31  # the kernel's ring buffer sizes are 32-bit; 2G is the largest here


def _ring_size(text: Optional[str], in_kernel: bool) -> int:
    if text is not None:
        size = parse_size(text)
        if size > MAX_RING_SIZE:
            raise UsageError("the ring buffer size must be at most %s, not %s"
                             % (format_size(MAX_RING_SIZE), text))
        return size
    return SUMMARY_RING_SIZE if in_kernel else DEFAULT_RING_SIZE


def _split_functions(value: Optional[str]) -> Optional[List[str]]:
    if not value:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


def _open_output(path: Optional[str]) -> IO[str]:
    """The file to write (created with the user's umask); a symbolic link is followed only
    when it belongs to us or to root, so that root cannot be tricked into overwriting a file
    through another user's link (the /tmp symlink attack)."""
    if path is None:
        if 1 in _CLOSED_AT_START:
            raise UsageError("stdout is closed: give the events a file with -o FILE")
        return sys.stdout
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    try:
        if not _trusted_symlink(path):
            flags |= os.O_NOFOLLOW  # not a link, and one swapped in meanwhile fails (ELOOP)
        return os.fdopen(os.open(path, flags, 0o666), "w", buffering=1 << 16)
    except OSError as err:
        raise UsageError("cannot write %s: %s" % (path, err.strerror)) from None


def _trusted_symlink(path: str) -> bool:
    """True if `path` is a symbolic link owned by us or root; UsageError if another user's."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISLNK(st.st_mode):
        return False
    if st.st_uid not in (os.geteuid(), 0):
        raise UsageError("refusing to write %s: it is a symbolic link owned by another user "
                         "(uid %d)" % (path, st.st_uid))
    return True


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
        _say("cannot write the reports to %s: %s" % ("stderr" if err else "stdout",
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
@click.option("--api", type=click.Choice(["runtime", "driver", "all"]), default="all",
              show_default=True, help="Which layer to trace.")
@click.option("--no-follow", is_flag=True,
              help="With a command: trace only its own process (filtered in the kernel), "
                   "not the processes it starts.")
@click.option("--json", "as_json", is_flag=True, help="JSON Lines, one object per event.")
@click.option("-o", "--output", metavar="FILE", help="Write events to FILE instead of stdout.")
@click.option("--ring-size", metavar="SIZE",
              help="Ring buffer size (power of two, e.g. 256K, 8M; default 4M, or 1M with "
                   "--summary alone, where few records travel).")
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
@click.option("--leaks", is_flag=True,
              help="Flag double frees and frees of unknown pointers as they happen; at the "
                   "end, list the allocations never freed.")
@click.option("--stacks", is_flag=True,
              help="Capture the user call stack of memory calls (--leaks shows where each "
                   "leak was allocated).")
@click.option("--save", metavar="FILE",
              help="Record the raw trace to FILE, for `ebpf-cuda report FILE` later.")
@click.option("--trace-out", metavar="FILE.json",
              help="Write a timeline in Chrome trace format (open in Perfetto UI).")
@click.option("--report", "report_html", metavar="FILE.html",
              help="Write a self-contained HTML report (tables and plots).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def trace(verbose: int, no_timestamps: bool, no_returns: bool, paths: Tuple[str, ...],
          pid: Optional[int], functions: Optional[str], everything: bool, api: str,
          no_follow: bool, as_json: bool, output: Optional[str],
          ring_size: Optional[str], spool_size: Optional[str], entries: bool,
          list_functions: bool, summary: bool, leaks: bool, stacks: bool, save: Optional[str], trace_out: Optional[str],
          report_html: Optional[str], command: Tuple[str, ...]) -> None:
    """Trace the CUDA calls of a program: ebpf-cuda [OPTIONS] [-- COMMAND [ARGS...]]"""
    if list_functions:
        for row in apis.TABLE:
            click.echo("%-32s %-8s %s" % (row.name, row.library, "with --all" if not row.default
                                          else "default*" if apis.driver_replaces(row)
                                          else "default"))
        click.echo("* not when the driver's launch functions are probed too: the driver sees "
                   "every launch")
        return
    # --summary alone: the kernel sums the calls up, no record per call.
    in_kernel = (_summary_only(summary, leaks, as_json, output, save, trace_out, report_html)
                 and not no_returns)
    tracer = Tracer(functions=_split_functions(functions), library=list(paths), pid=pid,
                    command=list(command), api=api, everything=everything,
                    follow_children=not no_follow, return_probes=not no_returns, entries=entries,
                    ring_size=_ring_size(ring_size, in_kernel), stacks=stacks,
                    aggregate=in_kernel, emit=not in_kernel, log=_log(verbose))
    namer = tracer.names
    analyses = _analyses(namer, summary, leaks)
    sinks = analyses + _event_sinks(output, as_json, no_timestamps, namer,
                                    events_wanted=not analyses and not (
                                        trace_out or report_html or save))
    sinks += _file_sinks(trace_out, report_html, namer)
    spool = (_spool(spool_size, output) if lines_only(sinks) is not None and not save
             else None)
    saver = _saver(save, tracer, namer)
    with tracer:
        _install_signals(tracer, spool)  # first: a signal after the start line must not kill us
        _report_start(tracer, verbose)
        tracer.trace_into(sinks, save=saver, spool=spool, reader_nice=READER_NICE,
                          notice=lambda text: click.echo("ebpf-cuda: %s" % text, err=True))
        reports = _final_reports(analyses, tracer, namer, stacks)
        stats = tracer.stats()
        tracer.close(wait=False)  # this process exits now: a child detaches the probes
    if reports:  # after JSON Lines on stdout, reports go to stderr
        click.echo("\n\n".join(reports), err=as_json and output is None)
    _report_lost(stats["lost"], spool)
    unnamed = tracer.unnamed_launches()
    if unnamed:
        click.echo("ebpf-cuda: %s" % unnamed, err=True)
    if tracer.exit_status is not None:
        sys.exit(tracer.exit_status)


READER_NICE = -10  # the CPU weight of ~9 ordinary threads (sched_prio_to_weight): a program
# with more busy threads than cores cannot starve the reader (the lines thread inherits it)


def _report_lost(ring_full: int, spool) -> None:
    """One line counting every event that did not reach the output, and why."""
    why = []
    if ring_full:
        why.append("%d with the ring buffer full (try --ring-size)" % ring_full)
    if spool is not None and spool.dropped:
        why.append("%d past the spool's %s (try --spool-size)" % (
            spool.dropped, spool.error or "%s bytes" % format_size(spool.limit)))
    if spool is not None and spool.abandoned:
        why.append("%d not written: interrupted" % spool.abandoned)
    lost = ring_full + (spool.dropped + spool.abandoned if spool is not None else 0)
    if lost:
        click.echo("ebpf-cuda: %d events lost: %s" % (lost, ", ".join(why)), err=True)


def _summary_only(summary: bool, *other_outputs) -> bool:
    """--summary and nothing that needs every event: then the kernel aggregates the calls
    and writes records only for the calls that teach kernel names (see Tracer's `emit`)."""
    return summary and not any(other_outputs)


def _event_sinks(output: Optional[str], as_json: bool, no_timestamps: bool,
                 namer: Optional[KernelNamer] = None, events_wanted: bool = True) -> List[Sink]:
    """Where decoded events go: text or JSON lines. Analyses and files add sinks here.
    With only end-of-run reports asked for (`events_wanted` False) and neither --json nor -o,
    no per-event writer at all."""
    if not events_wanted and not as_json and output is None:
        return []
    stream = _open_output(output)
    if as_json:
        from .output.jsonl import JsonWriter

        return [JsonWriter(stream, namer=namer)]
    return [TextWriter(stream, timestamps=not no_timestamps, namer=namer)]


def _analyses(namer: KernelNamer, summary: bool, leaks: bool) -> List[Sink]:
    """Sinks that build end-of-run reports; leak warnings are printed as they happen."""
    from .analysis import LeakTracker, Summary

    def warn(warning) -> None:
        click.echo("ebpf-cuda: warning: %s" % warning, err=True)

    analyses: List[Sink] = []
    if summary:
        analyses.append(Summary(namer=namer))
    if leaks:
        analyses.append(LeakTracker(on_warning=warn))
    return analyses


def _final_reports(analyses: List[Sink], tracer: Tracer, namer: KernelNamer,
                   stacks: bool) -> List[str]:
    """The reports of the analyses, rendered while the tracer (its stack map) is still open."""
    from .analysis import LeakTracker, Summary, format_leaks

    reports = []
    for analysis in analyses:
        if isinstance(analysis, Summary):
            reports.append(analysis.report(None if tracer.emit else tracer.aggregates()))
        elif isinstance(analysis, LeakTracker):
            reports.append(format_leaks(analysis, tracer.stack if stacks else None,
                                        namer.resolver))
    return reports


def _file_sinks(trace_out: Optional[str], report_html: Optional[str], namer) -> List[Sink]:
    """The timeline (--trace-out) and HTML report (--report) writers."""
    sinks: List[Sink] = []
    if trace_out:
        from .output.chrome_trace import ChromeTraceWriter  # only when asked for

        sinks.append(ChromeTraceWriter(_open_output(trace_out), namer=namer))
    if report_html:
        from .output.html_report import HtmlReport  # only when asked for

        sinks.append(HtmlReport(_open_output(report_html), namer=namer))
    return sinks


def _saver(path: Optional[str], tracer: Tracer, namer: KernelNamer):
    """With --save: the raw-trace writer (it learns kernel names for its trailer)."""
    if not path:
        return None
    from . import savefile

    _trusted_symlink(path)  # another user's symbolic link is refused, as for -o
    return savefile.open_save(path, tracer.apis_table, tracer.decoder.clock_offset_ns, namer)


def _spool(size: Optional[str], output: Optional[str]):
    """The spool between the ring reader and the lines (None with --spool-size 0)."""
    from .spool import DEFAULT_LIMIT, Spool

    limit = DEFAULT_LIMIT if size is None else parse_size(size)
    if limit == 0:
        return None
    # Beside the output file (its disk has room for what is written there anyway); not
    # beside /dev/null or a FIFO: in $TMPDIR then.
    directory = None
    if output and os.path.isfile(output):
        directory = os.path.dirname(os.path.abspath(output))
    try:
        return Spool(directory, limit)
    except OSError as err:
        raise UsageError("cannot create a spool file in %s: %s (--spool-size 0 does without)"
                         % (directory or "$TMPDIR", err.strerror)) from None


def _report_start(tracer: Tracer, verbose: int) -> None:
    files = sorted({a.path for a in tracer.attachments})
    click.echo("ebpf-cuda: probing %d functions in %s" % (
        len({a.api for a in tracer.attachments}), ", ".join(files)), err=True)
    for failure in tracer.failures:
        click.echo("ebpf-cuda: warning: %s" % failure, err=True)
    if verbose >= 2:  # each program once, with the functions that share it
        users: dict = {}
        for (name, retprobe), program in tracer.programs.items():
            users.setdefault(id(program), (program, retprobe, []))[2].append(name)
        for program, retprobe, names in users.values():
            click.echo("-- %s %s (%s) --\n%s" % (program.name, "return" if retprobe else "entry",
                                                 ", ".join(names), program.disassembly()),
                       err=True)


def _install_signals(tracer: Tracer, spool=None) -> None:
    """SIGINT/SIGTERM: stop after draining; with a command, pass the signal on to it and keep
    reading until it ends, so its last events are seen. Once reading is over, a signal
    stops the writing of the lines still spooled."""
    def handler(signum, frame):
        if spool is not None and spool.closed:
            spool.abandon()
            return
        child = tracer.child_pid
        if child is not None and tracer.exit_status is None:
            try:
                os.kill(child, signum)
                return
            except ProcessLookupError:
                pass
        tracer.stop()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", metavar="FILE")
@click.option("-t", "--no-timestamps", is_flag=True, help="Leave the time column out.")
@click.option("--json", "as_json", is_flag=True, help="JSON Lines, one object per event.")
@click.option("-o", "--output", metavar="FILE", help="Write events to FILE instead of stdout.")
@click.option("--summary", is_flag=True, help="Print the summary tables.")
@click.option("--leaks", is_flag=True, help="Flag double frees; list allocations never freed.")
@click.option("--trace-out", metavar="FILE.json", help="Write a Chrome trace timeline.")
@click.option("--report", "report_html", metavar="FILE.html", help="Write an HTML report.")
def report_cmd(path: str, no_timestamps: bool, as_json: bool, output: Optional[str],
               summary: bool, leaks: bool, trace_out: Optional[str],
               report_html: Optional[str]) -> None:
    """Outputs of a trace saved with --save: ebpf-cuda report FILE [OPTIONS]. Needs no
    privileges; kernel names are those known when tracing."""
    from . import savefile
    from .analysis import Summary, format_leaks

    saved = savefile.load(path)
    analyses = _analyses(saved.namer, summary, leaks)
    sinks = analyses + _event_sinks(output, as_json, no_timestamps, saved.namer,
                                    events_wanted=not analyses and not (trace_out or report_html))
    sinks += _file_sinks(trace_out, report_html, saved.namer)
    for sink in sinks:
        sink.header()
    try:
        for events in saved.batches():
            for sink in sinks:
                sink.write(events)
    finally:
        for sink in sinks:
            sink.close()
    reports = [a.report() if isinstance(a, Summary) else format_leaks(a) for a in analyses]
    if reports:  # as the live command shows them
        click.echo("\n\n".join(reports), err=as_json and output is None)
    if saved.truncated:
        click.echo("ebpf-cuda: %s ends in a partial record (the tracer was killed?)" % path,
                   err=True)


def main(argv: Optional[List[str]] = None) -> None:
    """Entry point of the console script: errors become one line and an exit code."""
    try:
        args = sys.argv[1:] if argv is None else list(argv)
        if args[:1] == ["report"]:
            report_cmd.main(args=args[1:], prog_name="ebpf-cuda report", standalone_mode=False)
        else:
            trace.main(args=args, prog_name="ebpf-cuda", standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(UsageError.exit_code)
    except VerifierError as err:
        click.echo("ebpf-cuda: %s" % err, err=True)
        if "-v" in (argv or sys.argv) or "--verbose" in (argv or sys.argv):
            lines = [line for line in err.log.splitlines() if line.strip()][-15:]
            click.echo("\n".join(lines), err=True)
        sys.exit(err.exit_code)
    except TracerError as err:
        click.echo("ebpf-cuda: %s" % err, err=True)
        sys.exit(err.exit_code)
    except BrokenPipeError:
        sys.exit(0)
