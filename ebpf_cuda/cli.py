"""The `ebpf-cuda` command: click options → a `Tracer` and an output. Only this module prints,
exits or installs signal handlers."""
import os
import signal
import sys
from typing import IO, List, Optional, Tuple

import click

from . import apis
from .errors import TracerError, UsageError, VerifierError
from .output import Sink
from .output.jsonl import JsonWriter
from .output.text import TextWriter
from .tracer import DEFAULT_RING_SIZE, Tracer

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """`8M` → 8388608; plain numbers are bytes."""
    text = text.strip().upper().rstrip("B").rstrip("I")
    unit = text[-1:] if text[-1:] in _UNITS else ""
    number = text[:-1] if unit else text
    if not number.isdigit():
        raise UsageError("bad size %r (examples: 65536, 256K, 8M)" % text)
    return int(number) * _UNITS[unit]


def _split_functions(value: Optional[str]) -> Optional[List[str]]:
    if not value:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


def _open_output(path: Optional[str]) -> IO[str]:
    if path is None:
        return sys.stdout
    try:
        return open(path, "w", buffering=1 << 16)
    except OSError as err:
        raise UsageError("cannot write %s: %s" % (path, err.strerror)) from None


def _log(verbose: int):
    def log(message: str) -> None:
        if verbose:
            click.echo(message, err=True)
    return log


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
@click.option("--ring-size", default=str(DEFAULT_RING_SIZE), show_default=True,
              help="Ring buffer size (power of two, e.g. 256K, 8M).")
@click.option("--entries", is_flag=True,
              help="Also emit each call's entry as it happens (for calls that block).")
@click.option("--list-functions", is_flag=True, help="List the traceable functions and exit.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def trace(verbose: int, no_timestamps: bool, no_returns: bool, paths: Tuple[str, ...],
          pid: Optional[int], functions: Optional[str], everything: bool, api: str,
          no_follow: bool, as_json: bool, output: Optional[str],
          ring_size: str, entries: bool, list_functions: bool, command: Tuple[str, ...]) -> None:
    """Trace the CUDA calls of a program: ebpf-cuda [OPTIONS] [-- COMMAND [ARGS...]]"""
    if list_functions:
        for row in apis.TABLE:
            click.echo("%-32s %-8s %s" % (row.name, row.library,
                                          "default" if row.default else "with --all"))
        return
    if no_returns and entries:
        raise UsageError("--entries needs return probes; it cannot go with -r")
    tracer = Tracer(functions=_split_functions(functions), library=list(paths), pid=pid,
                    command=list(command), api=api, everything=everything,
                    follow_children=not no_follow, return_probes=not no_returns, entries=entries,
                    ring_size=parse_size(ring_size), log=_log(verbose))
    sinks = _event_sinks(output, as_json, no_timestamps)
    with tracer:
        _report_start(tracer, verbose)
        _install_signals(tracer)
        _run(tracer, sinks)
        stats = tracer.stats()
    if stats["lost"]:
        click.echo("ebpf-cuda: %d events lost: the ring buffer was full (try --ring-size)"
                   % stats["lost"], err=True)
    if tracer.exit_status is not None:
        sys.exit(tracer.exit_status)


def _event_sinks(output: Optional[str], as_json: bool, no_timestamps: bool) -> List[Sink]:
    """Where decoded events go: text or JSON lines. Analyses and files add sinks here."""
    stream = _open_output(output)
    writer = JsonWriter(stream) if as_json else TextWriter(stream, timestamps=not no_timestamps)
    return [writer]


def _run(tracer: Tracer, sinks: List[Sink]) -> None:
    """Read until the end, decoding each batch once and handing it to every sink."""
    for sink in sinks:
        sink.header()
    decode = tracer.decoder.decode_frames
    try:
        for frames in tracer.frames():
            events = list(decode(frames))
            for sink in sinks:
                sink.write(events)
            sys.stdout.flush()  # a person watching sees each batch as it comes
    finally:
        for sink in sinks:
            sink.close()


def _report_start(tracer: Tracer, verbose: int) -> None:
    files = sorted({a.path for a in tracer.attachments})
    click.echo("ebpf-cuda: probing %d functions in %s" % (
        len({a.api for a in tracer.attachments}), ", ".join(files)), err=True)
    for failure in tracer.failures:
        click.echo("ebpf-cuda: warning: %s" % failure, err=True)
    if verbose >= 2:
        for (name, retprobe), program in tracer.programs.items():
            click.echo("-- %s %s --\n%s" % (name, "return" if retprobe else "entry",
                                            program.disassembly()), err=True)


def _install_signals(tracer: Tracer) -> None:
    """SIGINT/SIGTERM: stop after draining; with a command, pass the signal on to it and keep
    reading until it ends, so its last events are seen."""
    def handler(signum, frame):
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


def main(argv: Optional[List[str]] = None) -> None:
    """Entry point of the console script: errors become one line and an exit code."""
    try:
        trace.main(args=argv, prog_name="ebpf-cuda", standalone_mode=False)
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
