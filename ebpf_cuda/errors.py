"""Typed exceptions. Every error the library raises derives from `TracerError`.

Each carries a sentence a person understands (`str(err)`); kernel errors also carry `errno`.
The CLI maps each class to a distinct exit code (`exit_code`).
"""
from typing import Optional


class TracerError(Exception):
    """Base class of every error raised by ebpf_cuda."""

    exit_code = 1


class KernelError(TracerError):
    """A bpf() or perf_event_open() call failed; `errno` says why."""

    exit_code = 3

    def __init__(self, message: str, errno: int = 0, log: str = "") -> None:
        super().__init__(message)
        self.errno = errno
        self.log = log


class PrivilegeError(KernelError):
    """EPERM/EACCES from the kernel: the caller lacks CAP_BPF/CAP_PERFMON (or root)."""

    exit_code = 4


class VerifierError(KernelError):
    """The verifier rejected a program; `log` holds its log."""

    exit_code = 5


class AttachError(KernelError):
    """A uprobe could not be attached (names the function and file)."""

    exit_code = 6


class UnsupportedKernelError(KernelError):
    """The kernel lacks a needed feature (uprobe PMU, ring buffer...)."""

    exit_code = 7


class ElfError(TracerError):
    """A file is missing, not ELF, of a foreign class/architecture, truncated or stripped."""

    exit_code = 8


class SymbolNotFoundError(ElfError):
    """A symbol is not in the file; `suggestions` lists the closest names found."""

    exit_code = 9

    def __init__(self, message: str, suggestions: Optional[list] = None) -> None:
        super().__init__(message)
        self.suggestions = suggestions or []


class NoCudaSymbolsError(ElfError):
    """A file holds none of the CUDA functions asked for."""

    exit_code = 10


class ProcessError(TracerError):
    """A process id does not exist or cannot be inspected."""

    exit_code = 11


class UsageError(TracerError):
    """Bad or conflicting options (unknown function name, ...)."""

    exit_code = 2


class DecodeError(TracerError):
    """A record or saved trace could not be decoded."""

    exit_code = 12


class Interrupted(BaseException):
    """A stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) ended the command line tool where no
    trace was running yet (while starting, before the traced command runs). Not a
    TracerError: like KeyboardInterrupt it unwinds whatever was being set up, which closes
    it. Only the command line tool's handlers raise it; `signum` is the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
