"""The `ebpf-cuda` command: the entry point, which picks the command (trace, the default;
`report`; `analyze`; `monitor`) and turns what goes wrong into one line and an exit code.
Only this package (cli/) prints, exits or installs signal handlers.

trace.py is imported with this module (it is the command that runs most, and a start that
drops privileges must have imported what the tracer needs); report.py, analyze.py and
monitor.py when their command is given. click is imported when a command needs it: the
trace command's usual command lines are read without it (options.parse_simple)."""
import errno
import sys
from typing import Callable, Dict, List, Optional

from ..errors import Interrupted, KernelError, TracerError, UsageError, VerifierError
from .common import drop_stdout_buffer, echo, say, take_standard_fds
from .options import parse_simple
from .signals import quiet, stopper, unblock_stop_signals
from .trace import trace, trace_command


def main(argv: Optional[List[str]] = None) -> None:
    """Entry point of the console script: errors become one line and an exit code (it
    returns when that is 0)."""
    code = _flush_stdout(_main(argv))
    if code:
        sys.exit(code)


def _main(argv: Optional[List[str]]) -> int:
    """The exit code of a run."""
    take_standard_fds()
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        _run(args)
        return 0
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except Interrupted as err:
        quiet()
        stopper.say_interrupted(err.signum)
        return 128 + err.signum
    except KeyboardInterrupt:
        quiet()
        say("interrupted")
        return 130
    except _click_error("Abort"):
        return 130
    except _click_error("ClickException") as err:
        err.show()
        return UsageError.exit_code
    except VerifierError as err:
        if err.errno in (errno.EMFILE, errno.ENFILE):  # not the verifier's doing
            say(_too_many_files("loading the eBPF programs"))
            return KernelError.exit_code
        say(str(err))
        if "-v" in args or "--verbose" in args:
            lines = [line for line in err.log.splitlines() if line.strip()][-15:]
            echo("\n".join(lines))
        return err.exit_code
    except TracerError as err:
        if isinstance(err, KernelError) and err.errno in (errno.EMFILE, errno.ENFILE):
            say(_too_many_files(err))
        else:
            say(str(err) + _kernel_hint(err))
        return err.exit_code
    except OSError as err:  # what no layer turned into a sentence: still one line
        if err.errno in (errno.EMFILE, errno.ENFILE):
            say(_too_many_files(err.strerror))
            return KernelError.exit_code
        else:
            say("%s%s" % (err.strerror or err, ": %s" % err.filename if err.filename else ""))
        return 1


def _run(args: List[str]) -> None:
    """The command `args` name, run; each takes the stop signals its own way."""
    if args[:1] == ["report"]:
        from .report import report_cmd

        unblock_stop_signals()  # (Python's signals)
        report_cmd.main(args=args[1:], prog_name="ebpf-cuda report", standalone_mode=False)
    elif args[:1] == ["analyze"]:
        from .analyze import analyze_cmd

        unblock_stop_signals()  # (Python's signals)
        analyze_cmd.main(args=args[1:], prog_name="ebpf-cuda analyze", standalone_mode=False)
    elif args[:1] == ["monitor"]:
        from .monitor import monitor_cmd

        unblock_stop_signals()  # (its own signal handling: signals.MonitorSignals)
        monitor_cmd.main(args=args[1:], prog_name="ebpf-cuda monitor", standalone_mode=False)
    else:
        stopper.install()  # first: a signal from now on is handled
        params = parse_simple(args)
        if params is None:  # (help, errors, the unusual: click's)
            trace_command().main(args=args, prog_name="ebpf-cuda", standalone_mode=False)
        else:
            _as_click_runs(trace, params)


def _as_click_runs(callback: Callable[..., None], params: Dict[str, object]) -> None:
    """`callback(**params)` with what click's `Command.main(standalone_mode=False)` does
    around a command's callback: an EOFError or KeyboardInterrupt is an empty line on stderr
    and click's Abort; a broken pipe, exit code 1 with the standard streams quieted."""
    try:
        callback(**params)
    except (EOFError, KeyboardInterrupt) as err:
        import click

        click.echo(file=sys.stderr)
        raise click.exceptions.Abort() from err
    except OSError as err:
        if err.errno != errno.EPIPE:
            raise
        from click.utils import PacifyFlushWrapper

        sys.stdout = PacifyFlushWrapper(sys.stdout)
        sys.stderr = PacifyFlushWrapper(sys.stderr)
        sys.exit(1)


def _click_error(name: str):
    """click's exception class `name`; none (an empty tuple) while click is not imported:
    none of its exceptions can have been raised then."""
    return getattr(getattr(sys.modules.get("click"), "exceptions", None), name, ())


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


def _flush_stdout(code: int) -> int:
    """Whatever stdout still holds, written now: a failure is one line (and exit code 1
    unless there is already one), never the interpreter's traceback at exit."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except OSError as err:
        drop_stdout_buffer()
        if err.errno != errno.EPIPE:  # a reader that went away: as any filter, silent
            say("cannot write to stdout: %s" % (err.strerror or err))
        return code or 1
    except ValueError:
        pass
    return code
