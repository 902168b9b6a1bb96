"""`python -m ebpf_cuda`: the ebpf-cuda command.

The stop signals are blocked before anything else is imported (the command line tool takes
them in a thread of its own once it runs, see cli/signals.py): a Ctrl-C while Python loads
the command then is one line and exit 130, as at any later moment of start-up.
"""
import signal

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

    main()


if __name__ == "__main__":
    run()
