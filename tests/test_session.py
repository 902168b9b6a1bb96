"""session.py: the kernel objects of one trace, made from layout.py's specs, all closed."""
import os
import time

import pytest

from ebpf_cuda.spec import record, layout
from ebpf_cuda.errors import UsageError
from ebpf_cuda.session import Session
from ebpf_cuda.spec.config import TraceConfig
from kernel_fds import bpf_link_types, open_fds, perf_links

pytestmark = pytest.mark.kernel


def test_map_specs_follow_the_options():
    names = [s.name for s in layout.map_specs(1 << 20, 100, stacks=False, aggregate=False,
                                              follow=False)]
    assert names == [layout.EVENTS, layout.TASKS, layout.NAMES, layout.SCRATCH, layout.STATS]
    every = {s.name for s in layout.map_specs(1 << 20, 100, True, True, True)}
    assert every - set(names) == {layout.STACKS, layout.AGG, layout.ERRORS, layout.LAUNCHES,
                                  layout.CAPTURING, layout.CAPTURING_ANY, layout.FOLLOWED}
    agg = [s for s in layout.map_specs(1 << 20, 100, False, True, False) if s.name == layout.AGG]
    assert agg[0].entries == 100 * layout.KIND_SLOTS


def test_the_stack_slots_do_not_overlap_and_fit_the_stack():
    slots = [(layout.INFLIGHT_KEY_AT, 16),
             (layout.INFLIGHT_VALUE_AT, record.INFLIGHT_VALUE_SIZE),
             (layout.STAT_KEY_AT, 8), (layout.NOW_AT, 8), (layout.AGG_KEY_AT, 8),
             (layout.LAUNCH_KEY_AT, layout.LAUNCH_KEY.size),
             (layout.LAUNCH_VALUE_AT, layout.LAUNCH_VALUE.size), (layout.ERROR_KEY_AT, 8),
             (layout.ERROR_VALUE_AT, 8), (layout.FN_ID_AT, 8), (layout.NAME_LEN_AT, 8),
             (layout.NS_PID_TGID_AT, 8), (layout.PY_STACK_AT, 8), (layout.PY_KEY_AT, 16),
             (layout.PY_CODE_KEY_AT, 16), (layout.CAPTURE_KEY_AT, 8),
             (layout.CAPTURE_VALUE_AT, 8), (layout.CAPTURE_FLAG_AT, 8)]
    ends = [0] + [at for at, _ in slots]
    for (at, size), above in zip(slots, ends):
        assert at + size <= above, (at, size, above)  # each lies below the one before
    assert slots[-1][0] >= -512


def test_bad_combinations_are_refused_before_anything_is_created():
    with pytest.raises(UsageError, match="--entries needs return probes"):
        Session(TraceConfig(entries=True, return_probes=False))
    with pytest.raises(UsageError, match="either a PID or a command"):
        Session(TraceConfig(pid=1, command=("true",)))
    with pytest.raises(UsageError, match="power of two"):
        Session(TraceConfig(ring_size=12345))


def test_a_session_owns_its_maps_programs_and_links_and_closes_them_all(root, fake):
    lib, prog = fake
    before = open_fds()
    session = Session(TraceConfig(command=(str(prog), "malloc:64"), library=(str(lib),),
                                  aggregate=True, stacks=True)).start()
    try:
        assert {layout.EVENTS, layout.STATS, layout.NAMES, layout.AGG, layout.STACKS,
                layout.FOLLOWED} <= set(session.maps)
        assert layout.TASKS in session.maps or layout.INFLIGHT in session.maps
        assert session.attachments and session.programs and session.ring is not None
        assert session.command is not None and session.command.poll() is None  # held
        assert open_fds() - before
    finally:
        session.close()
    assert open_fds() <= before  # every bpf and perf fd closed
    assert session.command.wait() == 125  # never released: exits without running


def test_close_without_waiting_leaves_the_detaching_to_a_child(root, fake):
    """`close(wait=False)` returns at once; a forked child holds the links until it has
    detached them, then exits."""
    lib, prog = fake
    session = Session(TraceConfig(library=(str(lib),), functions=("cudaMalloc",))).start()
    assert bpf_link_types(os.getpid()) or not perf_links()
    session.close(wait=False)
    assert not bpf_link_types(os.getpid()) and not session.maps
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the child: reaped once done
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            break
        time.sleep(0.01)
    else:
        pytest.fail("the closing child did not exit")


def test_a_failed_start_closes_what_it_made(root, fake, monkeypatch):
    """An error after the maps, programs and links exist (here: forking the command)."""
    lib, prog = fake

    def no_fork(self):
        assert self.maps and self.programs and self._links  # all made by now
        raise OSError("no fork (simulated)")

    monkeypatch.setattr(Session, "_fork_command", no_fork)
    before = open_fds()
    with pytest.raises(OSError, match="simulated"):
        Session(TraceConfig(library=(str(lib),), command=(str(prog),))).start()
    assert open_fds() <= before
