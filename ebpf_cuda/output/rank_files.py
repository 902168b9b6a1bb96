"""Saved traces per process: `--save run-%r.ebpfcuda` writes each traced process's frames to
a file of its own (a torchrun or mpirun job: one file per rank).

The pattern's directives: `%r` the process's rank, `%p` its pid, `%%` a `%`. The rank is the
first of RANK_VARIABLES in the process's environment (/proc/PID/environ, read when its first
record is read), else the rank of the first communicator it makes (ncclCommInitRank*: the
file, named by the pid until then, is renamed), else its pid. Two processes that would share
a name (two with RANK=0) are told apart: the second gets `RANK-pidPID`. A path without `%r`
or `%p` is one file for every process, as always (`savefile.open_save`).

Each file is an ordinary saved trace (savefile.py). The ring buffer is shared by every
process, so what it lost cannot be told apart by process: each file records every loss of
the ring (its loss notes and its trailer), including those before the process's first record.

`RankFiles` has the interface of a `savefile.SaveWriter` (write_frames, learn, write,
note_lost, note_losses, close, from_start), so the stream hands it frames as it would one
file (stream.py, `deliver(save=...)`).
"""
import errno
import os
from itertools import groupby
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..decode.events import EXIT, Decoder, Event
from ..decode.losses import Losses
from ..decode.nccl import INIT_RANK
from ..errors import DecodeError, UsageError
from ..spec import record
from ..spec.apis import Api
from .savefile import Namer, SaveWriter, open_save

# Where launchers put a process's rank: torchrun (and most), Open MPI, MPICH/Hydra, Slurm.
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
_DIRECTIVES = {"r", "p", "%"}


def is_pattern(path: str) -> bool:
    """True when a --save path names one file per process (it holds `%r` or `%p`)."""
    return any(kind in ("r", "p") for kind, _ in _parts(path))


def check_pattern(path: str) -> None:
    """UsageError when a per-process pattern cannot work: an unknown `%` directive, `%r`/`%p`
    in the folder, a folder that is not there or not writable."""
    for kind, text in _parts(path):
        if kind == "bad":
            raise UsageError("--save %s: unknown %s (a per-process pattern knows %%r the rank, "
                             "%%p the pid, %%%% a %%)" % (path, text))
    folder = os.path.dirname(path)
    if "%" in folder:
        raise UsageError("--save %s: %%r and %%p go in the file's name, not in its folder"
                         % path)
    if not os.path.isdir(folder or "."):
        raise UsageError("cannot write %s: no folder %s" % (path, folder))
    if not os.access(folder or ".", os.W_OK | os.X_OK):
        raise UsageError("cannot write %s: the folder %s is not writable" % (path, folder or "."))


def expand(pattern: str, rank: str, pid: int) -> str:
    """The file name of a process: `pattern` with its directives replaced."""
    values = {"r": rank, "p": str(pid), "%": "%"}
    return "".join(values.get(kind, text) if kind != "text" else text
                   for kind, text in _parts(pattern))


def _parts(pattern: str) -> List[Tuple[str, str]]:
    """("text", text) and (directive, "%x") pieces; ("bad", "%x") for an unknown one."""
    parts: List[Tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        at = pattern.find("%", i)
        if at < 0:
            parts.append(("text", pattern[i:]))
            break
        if at > i:
            parts.append(("text", pattern[i:at]))
        code = pattern[at + 1:at + 2]
        parts.append((code if code in _DIRECTIVES else "bad", pattern[at:at + 2]))
        i = at + 2
    return parts


def environment_rank(pid: int) -> Optional[str]:
    """The rank a launcher gave a process (RANK_VARIABLES), from /proc/PID/environ; None when
    unset or unreadable (the process has gone)."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    found = {}
    for entry in data.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name.decode("latin-1") in RANK_VARIABLES:
            found[name.decode("latin-1")] = value.decode("latin-1").strip()
    for name in RANK_VARIABLES:
        if found.get(name, "").isdigit():
            return str(int(found[name]))
    return None


class RankFile:
    """The saved trace of one process."""

    def __init__(self, pid: int, path: str, writer: SaveWriter, rank: Optional[str]) -> None:
        self.pid = pid
        self.path = path
        self.writer = writer
        self.rank = rank  # None: named by its pid until a communicator tells its rank


class RankFiles:
    """Writes the frames of each process to its own saved trace (see the module's
    docstring); a savefile.SaveWriter to the stream."""

    def __init__(self, pattern: str, table: Sequence[Api], clock_offset_ns: int,
                 namer: Optional[Namer] = None) -> None:
        self.pattern = pattern
        self.output_name = pattern  # (how a write error names this output)
        self.table = table
        self.clock_offset_ns = clock_offset_ns
        self.namer = namer
        self.from_start: Optional[bool] = None  # given to every file (savefile.SaveWriter)
        self.stacks = None  # --stacks: given to every file (savefile.SaveWriter.stacks)
        self.files: Dict[int, RankFile] = {}  # by pid
        self._paths: Dict[str, int] = {}  # file -> the pid it holds
        self._by_rank = "r" in {kind for kind, _ in _parts(pattern)}
        self._init_ids = {i for i, api in enumerate(table) if api.name in INIT_RANK}
        self._decoder = Decoder(list(table), clock_offset_ns)  # (init calls only)
        self._ring_full = 0
        self._closed = False

    # -- the SaveWriter interface --------------------------------------------------------------

    def header(self) -> None:
        """Each file's header is written when its process's first record comes."""

    def write_frames(self, frames: bytes) -> None:
        """A batch of raw frames, each to its process's file (opened at its first)."""
        pids = record.frame_column(frames, record.PID_TGID + 4, "I")
        touched = set()
        size = record.FRAME_SIZE
        start = 0
        for pid, run in groupby(pids):  # runs of frames of one process, in order (in C)
            count = len(list(run))
            self._file(pid).writer.write_frames(frames[start * size:(start + count) * size])
            touched.add(pid)
            start += count
        if self._by_rank:
            self._ranks_made(frames)
        for pid in touched:  # (a killed tracer leaves every file as far as it was read)
            self.files[pid].writer.stream.flush()

    def learn(self, names: Iterable[Tuple[int, int, Optional[str]]]) -> None:
        """Kernel names of launches, (pid, func, name), each for its process's trailer."""
        for pid, func, name in names:
            found = self.files.get(pid)
            if found is not None:
                found.writer.learn([(pid, func, name)])

    def write(self, events: Iterable[Event]) -> None:
        """Decoded events (when other outputs decode them): their launches' kernel names."""
        if self.namer is None:
            return
        by_pid: Dict[int, List[Event]] = {}
        for ev in events:
            by_pid.setdefault(ev.pid, []).append(ev)
        for pid, mine in by_pid.items():
            if pid in self.files:
                self.files[pid].writer.write(mine)

    def note_lost(self, ring_full: int) -> None:
        """The ring's loss count so far, noted in every file (the ring is shared)."""
        self._ring_full = max(self._ring_full, ring_full)
        for found in self.files.values():
            found.writer.note_lost(ring_full)

    def note_losses(self, losses: Losses) -> None:
        """What the trace lost, for every file's trailer."""
        for found in self.files.values():
            found.writer.note_losses(losses)

    def close(self) -> None:
        """Finish every file (trailer, frame count)."""
        if self._closed:
            return
        self._closed = True
        for found in self.files.values():
            found.writer.from_start = self.from_start
            found.writer.close()

    # -- files ---------------------------------------------------------------------------------

    def paths(self) -> Dict[int, str]:
        """pid -> the file of its frames, so far."""
        return {pid: found.path for pid, found in self.files.items()}

    def _file(self, pid: int) -> RankFile:
        found = self.files.get(pid)
        if found is not None:
            return found
        rank = environment_rank(pid) if self._by_rank else None
        path = self._free_path(rank, pid)
        writer = _open(path, self.table, self.clock_offset_ns, self.namer)
        writer.from_start = self.from_start
        writer.stacks = self.stacks
        if self._ring_full:  # (records lost before this one may have been its own)
            writer.note_lost(self._ring_full)
        found = self.files[pid] = RankFile(pid, path, writer, rank)
        self._paths[path] = pid
        return found

    def _free_path(self, rank: Optional[str], pid: int) -> str:
        """The process's file name; `RANK-pidPID` when another process has that one."""
        shown = rank if rank is not None else str(pid)
        path = expand(self.pattern, shown, pid)
        if self._paths.get(path, pid) != pid:
            path = expand(self.pattern, "%s-pid%d" % (shown, pid), pid)
        return path

    def _ranks_made(self, frames: bytes) -> None:
        """A process named by its pid takes the rank of its first communicator."""
        if self._init_ids.isdisjoint(record.frame_column(frames, record.FN_ID, "H")):
            return
        try:
            made = self._decoder.decode_batch(frames, self._init_ids)
        except DecodeError:  # (a damaged record names no rank; the frames are saved as read)
            return
        for ev in made:
            found = self.files.get(ev.pid)
            rank = ev.args.get("rank")
            if (found is None or found.rank is not None or ev.phase != EXIT or ev.ret != 0
                    or not isinstance(rank, int)):
                continue
            found.rank = str(rank)
            path = self._free_path(found.rank, ev.pid)
            if path == found.path:
                continue
            try:
                os.rename(found.path, path)
            except OSError:  # (it keeps its pid's name)
                continue
            del self._paths[found.path]
            self._paths[path] = ev.pid
            found.path = path


def _open(path: str, table: Sequence[Api], clock_offset_ns: int,
          namer: Optional[Namer]) -> SaveWriter:
    """A new saved trace at `path`; an OSError naming it when it cannot be made (the stream
    then drops this output and counts what it misses, as for any output)."""
    from .files import trusted_symlink

    try:
        trusted_symlink(path)  # another user's symbolic link is refused, as for one file
        return open_save(path, table, clock_offset_ns, namer)
    except UsageError as err:
        raise OSError(errno.EACCES, str(err)) from None
