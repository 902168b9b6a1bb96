"""`python -m ebpf_cuda`: the ebpf-cuda command.

The stop signals are blocked before anything else is imported (the command line tool takes
them in a thread of its own once it runs, see cli/signals.py): a Ctrl-C while Python loads
the command then is one line and exit 130, as at any later moment of start-up.
"""
import os
import signal
import sys

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def run() -> None:
    """The command, its stop signals held from the first moment."""
    stop = [signum for signum in _STOP_SIGNALS
            if signal.getsignal(signum) is not signal.SIG_IGN]  # ignored stays ignored
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    from .targets import command

    if command.commands_mask() is None:  # (unless whoever runs this gave it already)
        command.give_commands_mask(mask)
    from .cli.main import main

    try:
        main()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if not isinstance(done.code, (int, type(None))):
            print(done.code, file=sys.stderr)
    _exit_now(code)


def _exit_now(code: int) -> None:
    """Exit without the interpreter's finalisation: every output is closed and every thread
    left is a daemon by now, and tearing down the modules and objects of a trace took
    80-300 ms of the exit on a busy machine (the exit after the command ends is one of the
    tool's figures: bench/exit.py)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            code = code or 1  # (main() has said why already when it could)
    os._exit(code)


if __name__ == "__main__":
    run()
