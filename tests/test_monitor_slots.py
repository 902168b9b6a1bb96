"""The monitor's sums by process in process slots (probes/aggregates.py,
_count_in_process_slot: a slot a process, cached in each thread's task storage, no hash on a
call's path) with real probes: processes, some short-lived, some with threads, more than the
slots, make known calls, and every process's figures are exact (those beyond the slots
counted through `proc_calls`, and said); the slots of exited processes are cleared when the
monitor lets them go, and taken again by new ones."""
from typing import Dict, List, Tuple

import pytest

from ebpf_cuda import asm
from ebpf_cuda.arch import current
from ebpf_cuda.bpf import features
from ebpf_cuda.errors import UsageError
from ebpf_cuda.monitor import prometheus
from ebpf_cuda.probes import calls, plan
from ebpf_cuda.probes.options import HASH_ONLY
from ebpf_cuda.spec import layout
from ebpf_cuda.spec.apis import BY_NAME, FN_ID
from ebpf_cuda.spec.config import TraceConfig
from monitor_support import Held, parse_metrics, running_monitor, settle, value

SLOTS = 4
CALLS, ERRORS = "ebpf_cuda_process_api_calls_total", "ebpf_cuda_process_api_errors_total"
# (threads, cudaMalloc calls a thread) of each process: started together, then one by one
TOGETHER = [(3, 7), (1, 11), (4, 5), (2, 13), (1, 3), (3, 2)]
ONE_BY_ONE = [(1, 4), (2, 6), (1, 1)]


def _ops(threads: int, mallocs: int) -> List[str]:
    """Two cudaSetDevice calls (the second fails), then `mallocs` cudaMalloc calls in each of
    `threads` threads."""
    return ["setdevice:0", "setdevice:9", "threads:%d:%d:malloc:64" % (threads, mallocs)]


def _run(prog, together, one_by_one) -> Dict[int, int]:
    """pid -> its cudaMalloc calls, the processes run and exited."""
    calls = {}
    held = [(Held(prog, _ops(*shape)), shape) for shape in together]
    try:
        for process, _ in held:
            process.go()
        for process, (threads, mallocs) in held:
            process.wait()
            calls[process.pid] = threads * mallocs
    finally:
        for process, _ in held:
            process.kill()
    for threads, mallocs in one_by_one:
        process = Held(prog, _ops(threads, mallocs)).go()
        process.wait()
        calls[process.pid] = threads * mallocs
    return calls


def _check(samples, calls: Dict[int, int]) -> None:
    """Each process's calls and errors exactly, and nothing counted but not by process."""
    for pid, mallocs in calls.items():
        assert value(samples, CALLS, pid=str(pid), api="cudaMalloc") == mallocs, pid
        assert value(samples, ERRORS, pid=str(pid), api="cudaMalloc") == 0, pid
        assert value(samples, CALLS, pid=str(pid), api="cudaSetDevice") == 2, pid
        assert value(samples, ERRORS, pid=str(pid), api="cudaSetDevice") == 1, pid
    assert value(samples, CALLS, api="cudaMalloc") == sum(calls.values())
    assert value(samples, "ebpf_cuda_api_calls_total", api="cudaMalloc") == sum(calls.values())
    assert value(samples, "ebpf_cuda_events_lost_total", cause="process_map_full") == 0


def _need_task_storage(slots: int) -> None:
    if slots and not features.task_storage():
        pytest.skip("no task storage (%s): no process slots" % features.task_storage_reason())


def _slots(monitor) -> Tuple[List[Tuple[int, int]], bytes]:
    """The held slots (slot, pid) and every slot's sums."""
    slots = monitor.sums._process_slots
    return slots.owned(), slots.sums.values()


@pytest.mark.kernel
@pytest.mark.parametrize("slots", [SLOTS, 0])
def test_each_process_has_exactly_its_calls_beyond_the_slots_too(prog, lib, slots):
    """With 4 slots, 9 processes: 4 take one (each probes every slot: PROCESS_SLOT_PROBES
    is more), the 5 others go to `proc_calls`, the monitor says so; with 0 (as where the
    kernel has no task storage) every call goes to `proc_calls`."""
    _need_task_storage(slots)
    with running_monitor(paths=(str(lib),), process_slots=slots) as monitor:
        calls = _run(prog, TOGETHER, ONE_BY_ONE)
        settle(monitor)
        samples = parse_metrics(prometheus.render(monitor.collect()).decode())
        _check(samples, calls)
        maps = monitor.tracer.session.maps
        if not slots:
            assert layout.PROCESS_OWNERS not in maps
            assert {layout.PROCESS_KEY.unpack(k)[0] for k in maps[layout.PROCESS_CALLS]
                    .keys()} == set(calls)
            return
        owned, _ = _slots(monitor)
        beyond = monitor.sums.processes_in_hash()
        assert len(owned) == SLOTS and {pid for _, pid in owned} | beyond == set(calls)
        assert len(beyond) == len(calls) - SLOTS and monitor.slots_full == len(beyond)


@pytest.mark.kernel
def test_the_slots_of_exited_processes_are_cleared_and_taken_again(prog, lib):
    """The first processes exit and are let go (their figures collected first): their slots
    and hash entries go, every slot's sums are 0; new processes take the slots, and
    their figures are theirs alone."""
    _need_task_storage(SLOTS)
    with running_monitor(paths=(str(lib),), process_slots=SLOTS) as monitor:
        first = _run(prog, TOGETHER[:3], ONE_BY_ONE[:2])
        settle(monitor)
        _check(parse_metrics(prometheus.render(monitor.collect()).decode()), first)
        assert len(_slots(monitor)[0]) == SLOTS
        settle(monitor)  # (collected: the next tick lets them go)
        samples = parse_metrics(prometheus.render(monitor.collect()).decode())
        owned, sums = _slots(monitor)
        assert owned == [] and not any(sums)
        assert not monitor.sums.processes_in_hash()
        assert not any(value(samples, CALLS, pid=str(pid)) for pid in first)
        assert value(samples, "ebpf_cuda_api_calls_total", api="cudaMalloc") == sum(
            first.values())
        second = _run(prog, TOGETHER[3:5], ONE_BY_ONE[2:])
        settle(monitor)
        samples = parse_metrics(prometheus.render(monitor.collect()).decode())
        for pid, mallocs in second.items():
            assert value(samples, CALLS, pid=str(pid), api="cudaMalloc") == mallocs
            assert value(samples, CALLS, pid=str(pid), api="cudaSetDevice") == 2
        assert value(samples, CALLS, api="cudaMalloc") == sum(second.values())
        assert {pid for _, pid in _slots(monitor)[0]} == set(second)
        assert not monitor.sums.processes_in_hash()


@pytest.mark.parametrize("slots", [3, -1, 1 << 15])
def test_a_slot_count_not_a_power_of_two_is_refused(slots):
    with pytest.raises(UsageError, match="process slots"):
        TraceConfig(per_process=True, aggregate=True, process_slots=slots).checked()


@pytest.mark.parametrize("task_storage", [True, False])
def test_without_task_storage_the_sums_by_process_stay_in_the_hash(task_storage):
    """Where the kernel has no task storage (5.10) no slot can be cached: the programs keep
    every call's sums in `proc_calls`, and the slots' maps are not made."""
    config = TraceConfig(aggregate=True, emit=False, per_process=True).checked()
    features = plan.Features(current(), True, task_storage)
    api = BY_NAME["cudaMalloc"]
    options = plan.probe_options(api, config, features)
    assert options.per_process == (layout.PROCESS_SLOTS if task_storage else HASH_ONLY)
    used = asm.map_names(calls.return_program(api, FN_ID[api.name], current(), options))
    assert (layout.PROCESS_OWNERS in used) == task_storage
    assert (layout.PROCESS_SUMS in used) == task_storage
    assert layout.PROCESS_CALLS in used  # (the processes beyond the slots)
    made = {s.name for s in layout.map_specs(1 << 20, 162, False, True, False, per_process=True,
                                             process_slots=plan.process_slots(config, features))}
    assert (layout.PROCESS_OWNERS in made) == task_storage and layout.PROCESS_CALLS in made
