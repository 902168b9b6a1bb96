"""Hello records: a thread's first traced call sends one (record.PHASE_HELLO), which wakes
the reader so that it reads the process's mappings while the process lives. They are no
events: the decoder, the outputs and every count leave them out. (That each process is
snapshotted once, at its first batch, is tests/test_names.py's.)"""
import json
import signal
import subprocess
import sys
import time

import pytest

from ebpf_cuda.bpf import features
from ebpf_cuda.spec import record
from ebpf_cuda.probes.loader import LOADER_MARK
from ebpf_cuda.tracer import Tracer
from helpers import cli_env, slowdown


@pytest.mark.kernel
def test_one_hello_per_thread_and_no_event(root, robust):
    _, prog = robust
    threads, per_thread = 4, 1000
    hellos, calls, events = [], 0, 0
    with Tracer(functions=["cudaMemcpy"], command=[str(prog), "threads", str(threads),
                                                   str(per_thread)],
                ring_size=8 << 20) as tracer:
        for frames in tracer.frames():
            ids = record.frame_column(frames, record.FN_ID, "H")
            tids = record.frame_column(frames, record.PID_TGID, "I")
            pids = record.frame_column(frames, record.PID_TGID + 4, "I")
            marks = record.frame_column(frames, record.ARGS, "Q")  # (loader_watch's notices)
            hellos += [(pid, tid) for fn, pid, tid, mark in zip(ids, pids, tids, marks)
                       if fn == record.HELLO_FN and mark != LOADER_MARK]
            calls += record.call_count(frames)
            events += len(tracer.decoder.decode_batch(frames))
        child, lost = tracer.child_pid, tracer.stats()["lost"]
    assert lost == 0
    assert calls == threads * per_thread and events == 2 * calls  # enter + exit per call
    if not features.task_storage():  # (the `greeted` word is in task storage: before 5.11
        assert hellos == []          # no hello records; the maps are read at the first call)
        return
    assert len(hellos) == threads == len(set(hellos))  # once per thread, each its own
    assert all(pid == child for pid, _ in hellos)


@pytest.mark.kernel
def test_short_lived_process_traced_system_wide_has_its_launch_named(root, fake, tmp_path):
    """The process pauses after its first call (as CUDA's initialisation does: 100 ms),
    launches and exits at once: the reader, woken by the hello, has read its mappings
    meanwhile; the name-teaching call alone comes too late for a process that exits right
    after it. (On an emulated machine the pause is 300 ms per slowdown: in the kernel
    matrix's guests the reader, Python reading files over 9p, missed pauses of 100 ms every
    time and one of ~1.2 s, and made others of 0.6 to 6 s.)"""
    lib, prog = fake
    slower = slowdown()
    pause_ms = 100 if slower < 1.5 else int(300 * slower)
    out = tmp_path / "t.jsonl"
    tracer = subprocess.Popen([sys.executable, "-m", "ebpf_cuda", "--json", "-o", str(out),
                               "-p", str(lib)], stderr=subprocess.PIPE, text=True,
                              env=cli_env())
    try:
        assert "probing" in tracer.stderr.readline()
        subprocess.run([str(prog), "malloc:64", "sleep:%d" % pause_ms, "getkernel",
                        "launchhandle:4:256"],
                       capture_output=True, check=True, timeout=30)
        time.sleep(0.2)
    finally:
        tracer.send_signal(signal.SIGINT)
        _, stderr = tracer.communicate(timeout=30)
    assert tracer.returncode == 0, stderr
    events = [json.loads(line) for line in out.read_text().splitlines()]
    launches = [e for e in events if e["api"] == "cudaLaunchKernel" and e["phase"] == "exit"]
    assert [e.get("kernel") for e in launches] == ["vec_add_kernel"]
