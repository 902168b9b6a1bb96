"""`python -m ebpf_cuda`: the ebpf-cuda command.

Stop signals are handled before anything else is imported: a Ctrl-C while Python loads the
command is one line and exit 130, as at any later moment of start-up.
"""
import signal
import sys

from .errors import Interrupted

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _interrupted(signum: int, frame) -> None:
    raise Interrupted(signum)


def run() -> None:
    """The command, its stop signals handled from the first moment."""
    try:
        for signum in _STOP_SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:  # ignored stays ignored
                signal.signal(signum, _interrupted)
        from .cli import main
    except (Interrupted, KeyboardInterrupt) as err:  # (Python's own, before ours is on)
        signum = getattr(err, "signum", signal.SIGINT)
        sys.stderr.write("ebpf-cuda: interrupted by %s while starting\n"
                         % signal.Signals(signum).name)
        sys.exit(128 + signum)
    main()


if __name__ == "__main__":
    run()
