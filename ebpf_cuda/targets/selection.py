"""Which files to probe, and which functions of the selection each one defines."""
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..bpf import features
from ..errors import NoCudaSymbolsError, TracerError, UsageError
from ..spec import apis
from ..spec.apis import Api
from . import discovery
from .elf import open_elf

Log = Callable[[str], None]


class Target:
    """A file to probe and the (api, symbol, offset) entries found in it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.functions: List[Tuple[Api, str, int]] = []
        self.missing: List[str] = []

    def __repr__(self) -> str:
        return "Target(%r, %d functions)" % (self.path, len(self.functions))

    def sites_by_name(self) -> Dict[str, List[Tuple[str, str, int]]]:
        """Its (function, symbol, offset) sites by function name, in their order."""
        sites: Dict[str, List[Tuple[str, str, int]]] = {}
        for api, symbol, offset in self.functions:
            sites.setdefault(api.name, []).append((api.name, symbol, offset))
        return sites


def find_targets(selected: Sequence[Api], library: Sequence[str], pid: Optional[int],
                 command: Sequence[str], log: Log) -> List[Target]:
    """The files to probe (`library`, else found for the pid, the command or the machine)
    with the selected functions each defines; NoCudaSymbolsError when none defines any."""
    if pid is not None:
        check_proc_is_ours(pid)
    paths = list(library) or _library_paths(selected, pid, command, log)
    targets = []
    seen = {}  # (device, inode) -> the path probed: a file is probed once, however reached
    for path in paths:
        identity = _identity(path)
        if identity in seen:
            log("%s: the same file as %s, probed once" % (path, seen[identity]))
            continue
        target = _target(path, selected)
        if target.functions:
            targets.append(target)
            seen[identity] = path
        else:
            log("%s: none of the selected functions, skipped" % path)
    if not targets:
        raise NoCudaSymbolsError("none of the %d selected functions is defined in %s"
                                 % (len(selected), ", ".join(paths)))
    return targets


def check_proc_is_ours(pid: int) -> None:
    """UsageError when /proc numbers processes for another PID namespace than the tracer's
    (`unshare --pid --fork` without --mount-proc): PID, a pid of the tracer's namespace
    (the one the probes' pid filter takes), names another process there."""
    if features.pid_namespace() is not None and features.proc_of_another_namespace():
        raise UsageError("cannot trace process %d: /proc is another PID namespace's than this "
                         "tracer's (mount its own /proc, e.g. unshare --pid --fork "
                         "--mount-proc)" % pid)


def _identity(path: str) -> Tuple[int, int]:
    """(device, inode) of the file at `path`, or of the path itself when it cannot be read
    (open_elf then says why)."""
    try:
        st = os.stat(path)
    except OSError:
        return (-1, hash(path))
    return (st.st_dev, st.st_ino)


def _target(path: str, selected: Sequence[Api]) -> Target:
    elf = open_elf(path)
    defined = elf.has_any([s for api in selected for s in api.symbols])
    target = Target(discovery.attach_path(path))
    for api in selected:
        found = [s for s in api.symbols if s in defined]
        if not found:
            target.missing.append(api.name)
        for symbol in found:
            target.functions.append((api, symbol, elf.symbol_offset(symbol)))
    return target


def driver_launches(targets: Sequence[Target]) -> bool:
    """Whether the driver's launch functions are among the targets' (then the runtime's
    are not probed: launch_at_driver_only)."""
    return any(api.library == apis.DRIVER and api.category == "launch"
               for target in targets for api, _, _ in target.functions)


def launch_at_driver_only(targets: List[Target], log: Log) -> List[Target]:
    """Default set, both layers: when the driver's launch functions are probed, the
    runtime's are not. The driver sees every launch (also those of libraries with their
    own static runtime) and names it from the handles it learned; probing the runtime's
    launch too would add two probe hits to each launch, the costliest call of a real
    workload. Name them (--functions) or use --all to see them anyway."""
    if not driver_launches(targets):
        return targets
    for target in targets:
        target.functions = [f for f in target.functions if not apis.driver_replaces(f[0])]
    log("launches are probed in the driver only (the runtime's launch functions: "
        "with --all or --functions)")
    return [target for target in targets if target.functions]


def _library_paths(selected: Sequence[Api], pid: Optional[int], command: Sequence[str],
                   log: Log) -> List[str]:
    kinds = [kind for kind in apis.LIBRARIES if any(a.library == kind for a in selected)]
    found: List[str] = []
    for kind in kinds:
        paths = _find_library(kind, pid, command)
        if not paths:
            log("no %s library found; %s calls are not traced"
                % ("NCCL" if kind == apis.NCCL else "CUDA " + kind, kind))
        found += [p for p in paths if p not in found]
    if not found:
        where = ("process %d" % pid if pid is not None
                 else "command %s" % command[0] if command else "this machine")
        names = " or ".join(_LIBRARY_NAMES[kind] for kind in kinds)
        raise TracerError("no %s library (%s) found for %s; name one with -p PATH"
                          % ("NCCL" if kinds == [apis.NCCL] else "CUDA", names, where))
    return found


_LIBRARY_NAMES = {apis.RUNTIME: "libcudart", apis.DRIVER: "libcuda", apis.NCCL: "libnccl"}


def _find_library(kind: str, pid: Optional[int], command: Sequence[str]) -> List[str]:
    """Runtime, driver or NCCL library files for the target: those a process has mapped
    (else those it would find: a probe on a file applies to every process mapping it later)."""
    if kind == apis.NCCL:
        return discovery.nccl_libraries(pid, command)
    driver = kind == apis.DRIVER
    if pid is not None:
        found = (discovery.driver_libraries_in_process(pid) if driver
                 else discovery.libraries_in_process(pid))
        if found:
            return found
    elif command:
        return (discovery.driver_library_for_command(list(command)) if driver
                else discovery.libraries_for_command(list(command)))
    found = discovery.find_driver_library() if driver else discovery.find_library()
    return found[:1] if driver else found
