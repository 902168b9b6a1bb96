"""The notices in a batch of the ring's frames: which processes' dynamic loaders told of a
change of their link maps (probes/loader.py's loader notices), which exec'd (probes/execs.py's
exec notices, the monitor's). Both are hello records: every other reader skips them.
"""
from typing import Dict, Sequence, Tuple

from ..probes.execs import EXEC_MARK
from ..probes.loader import LOADER_MARK
from ..spec import record

NOTICE_LOADER, NOTICE_EXEC = 1, 2  # what a process's notices in a batch were
_KIND_OF = {LOADER_MARK: NOTICE_LOADER, EXEC_MARK: NOTICE_EXEC}


def notice_times(frames: bytes) -> Dict[int, int]:
    """pid -> the time (ns, CLOCK_MONOTONIC) of its first loader notice in this batch."""
    return {pid: ns for pid, (ns, _) in notices(frames, (LOADER_MARK,)).items()}


def notices(frames: bytes, marks: Sequence[int] = (LOADER_MARK, EXEC_MARK)
            ) -> Dict[int, Tuple[int, int]]:
    """pid -> (the time of its first notice in this batch, the marks of its notices OR'ed
    as NOTICE_LOADER | NOTICE_EXEC) for the notices of these `marks`."""
    if record.HELLO_FN not in record.frame_ids(frames):
        return {}
    ids = record.frame_column(frames, record.FN_ID, "H")
    cells = record.frame_column(frames, record.ARGS, "Q")
    pids = record.frame_column(frames, record.PID_TGID + 4, "I")
    times = record.frame_column(frames, record.TS_ENTER, "Q")
    found: Dict[int, Tuple[int, int]] = {}
    for i, fn in enumerate(ids):
        if fn == record.HELLO_FN and cells[i] in marks:
            ns, kinds = found.get(pids[i], (times[i], 0))
            found[pids[i]] = (ns, kinds | _KIND_OF[cells[i]])
    return found
