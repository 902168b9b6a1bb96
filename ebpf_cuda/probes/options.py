"""What the generated programs do beyond the basics (`ProbeOptions`): which state the entry
saves, what the return writes, how the reader is woken, which processes are traced."""
from typing import NamedTuple, Optional, Tuple


HASH_ONLY = -1  # (ProbeOptions.per_process)


class ProbeOptions(NamedTuple):
    """What the generated programs do beyond the basics."""

    stash: bool = True  # entry saves state for a return probe
    emit_entry: bool = False  # entry also writes an enter record
    # Wake the reader only as this many bytes come to wait in the ring (the records whose
    # fill lands just past it: records.submit) (0: the kernel's adaptive wakeup, one per
    # record when the reader keeps up, which costs the traced thread about half a
    # microsecond each time); the reader also polls on a short timeout.
    wakeup_bytes: int = 0
    wake_now: bool = False  # wake the reader at once (calls that teach kernel names: rare)
    stacks: bool = False  # return records carry the caller's user stack id (`stacks` map)
    emit: bool = True  # the return probe writes a record per call
    follow: bool = False  # only processes in the `followed` map (see follow.py) are traced
    # Keep calls in flight in task-local storage (`tasks` map: a small per-thread stack)
    # rather than the `inflight` hash map: no hashing, no deletes, nothing left by dead threads.
    task_storage: bool = False
    aggregate: bool = False  # the return probe adds the call to in-kernel aggregates
    # The tracer's PID namespace (features.PidNamespace: nsfs device, inode) when it is not
    # the initial one: pids as that namespace numbers them (bpf_get_ns_current_pid_tgid,
    # once per program run), threads outside it not traced, children followed through the
    # `forked` map (follow.py). None: the kernel's pids (bpf_get_current_pid_tgid).
    pid_ns: Optional[Tuple[int, int]] = None
    # --py-stacks: where task_struct keeps the thread pointer (kernel_btf.py); the entry
    # walks the thread's Python frames (probes/pystack.py). None: no Python stacks.
    py_stacks: Optional[int] = None
    # Uprobe sessions (the monitor's launch rows, kernels with them): one program on entry and
    # return, the return taken by 1 call in `sample_returns` (a power of two) and by every
    # call while its process captures; the others are counted at entry (calls, launches)
    # and cost no return trap. `is_return_kfunc`: bpf_session_is_return's BTF id.
    sample_returns: int = 0
    is_return_kfunc: int = 0
    # Aggregates also by process (the monitor): False (0) not; HASH_ONLY every call through the
    # `proc_calls` hash (no task storage: Linux 5.10); N > 0 in N process slots (task
    # storage caches a thread's: aggregates.py), the processes beyond them in the hash
    per_process: int = False
    # task_struct's (pid, tgid, comm) offsets (kernel BTF, with task storage): a record's
    # pid_tgid and comm loaded through bpf_get_current_task_btf's pointer, not by the
    # get_current_pid_tgid and get_current_comm helpers (~20 and ~70 ns a call here).
    task_fields: Optional[Tuple[int, int, int]] = None
