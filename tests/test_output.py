"""Text and JSON formatting of hand-made events (no kernel involved)."""
import io
import json
import time

import pytest

from ebpf_cuda.decode.events import ENTER, EXIT
from ebpf_cuda.output.jsonl import JsonWriter
from ebpf_cuda.output.text import (HEADER_NO_TIME, HEADER_WITH_TIME, TextWriter, details,
                                   format_event, format_value)
from helpers import event

TS = 1700000000.123456  # 2023-11-14, wall clock


def _event(api, phase, args, pid=4242, tid=4242, **exit_fields):
    return event(api, phase, args, ts=TS, ts_ns=5_000_000, pid=pid, tid=tid, comm="basic02",
                 **exit_fields)


def _exit(api, args, ret_name="cudaSuccess", ret=0, duration_ns=12_345, outs=None, faults=(),
          **kw):
    return _event(api, EXIT, args, ret=ret, ret_name=ret_name, duration_ns=duration_ns,
                  outs=outs or {}, faults=faults, **kw)


MALLOC_ENTER = _event("cudaMalloc", ENTER, {"size": 4000})
MALLOC_EXIT = _exit("cudaMalloc", {"size": 4000}, outs={"ptr": 0x7F0000000000})
LAUNCH_ARGS = {"func": 0x401136, "grid": (4, 1, 1), "block": (256, 2, 1), "smem": 1024,
               "stream": 0x5000}


@pytest.mark.parametrize("kind,value,shown", [
    ("size", 4000, "4000 bytes"),
    ("ptr", 0x7F0000000000, "0x7f0000000000"),
    ("ptr", 0, "0x0"),
    ("handle", 0x5000, "0x5000"),
    ("dim3", (4, 1, 1), "(4,1,1)"),
    ("int", -1, "-1"),
    ("uint", 7, "7"),
    ("u64", 1 << 40, str(1 << 40)),
    ("float", 1.5, "1.5"),
    ("memcpy_kind", "HostToDevice", "HostToDevice"),
])
def test_format_value(kind, value, shown):
    assert format_value(kind, value) == shown


def test_enter_details_are_the_arguments_in_order():
    assert details(MALLOC_ENTER) == "size=4000 bytes"
    memcpy = _event("cudaMemcpy", ENTER, {"dst": 0x7F0000000000, "src": 0x55550000,
                                          "size": 64, "kind": "DeviceToHost"})
    assert details(memcpy) == "dst=0x7f0000000000 src=0x55550000 size=64 bytes kind=DeviceToHost"
    launch = _event("cudaLaunchKernel", ENTER, LAUNCH_ARGS)
    assert details(launch) == ("func=0x401136 grid=(4,1,1) block=(256,2,1) smem=1024 "
                               "stream=0x5000")


def test_enter_without_shown_arguments_has_empty_details():
    assert details(_event("cudaGetDevice", ENTER, {})) == ""


def test_kernel_name_replaces_the_function_address():
    launch = _event("cudaLaunchKernel", ENTER, LAUNCH_ARGS)
    assert details(launch, "vec_add").startswith("func=vec_add grid=(4,1,1)")


def test_exit_details_return_outs_duration():
    assert details(MALLOC_EXIT) == "returned=cudaSuccess ptr=0x7f0000000000 (12.3 us)"
    device = _exit("cudaGetDevice", {}, outs={"device": 1}, duration_ns=1000)
    assert details(device) == "returned=cudaSuccess device=1 (1.0 us)"
    failed = _exit("cudaSetDevice", {"device": 7}, ret=101, ret_name="cudaErrorInvalidDevice",
                   duration_ns=1_500_000)
    assert details(failed) == "returned=cudaErrorInvalidDevice (1500.0 us)"


def test_exit_details_name_unreadable_out_parameters():
    faulted = _exit("cudaStreamCreate", {}, faults=("stream",))
    assert details(faulted) == "returned=cudaSuccess stream=<unreadable> (12.3 us)"


def test_line_layout_with_and_without_time():
    clock = time.strftime("%H:%M:%S", time.localtime(TS))
    no_time = "basic02          4242    cudaMalloc            [ENTER] size=4000 bytes"
    assert format_event(MALLOC_ENTER, timestamps=False) == no_time
    assert format_event(MALLOC_ENTER) == "%s.123456 %s" % (clock, no_time)
    assert format_event(MALLOC_EXIT, timestamps=False) == (
        "basic02          4242    cudaMalloc             [EXIT] returned=cudaSuccess "
        "ptr=0x7f0000000000 (12.3 us)")


def test_long_function_names_still_leave_a_space():
    sync = _event("cudaStreamSynchronize", ENTER, {"stream": 0})
    assert format_event(sync, timestamps=False) == (
        "basic02          4242    cudaStreamSynchronize  [ENTER] stream=0x0")


def test_tid_is_shown_only_when_it_differs_from_pid():
    assert "tid=" not in format_event(MALLOC_ENTER, timestamps=False)
    other = _event("cudaMalloc", ENTER, {"size": 1}, tid=4243)
    assert format_event(other, timestamps=False).endswith("size=1 bytes tid=4243")


def test_text_writer_header_and_batch():
    out = io.StringIO()
    writer = TextWriter(out, timestamps=False)
    writer.header()
    writer.write([MALLOC_ENTER, MALLOC_EXIT])
    writer.write([])
    lines = out.getvalue().splitlines()
    assert lines == [HEADER_NO_TIME, format_event(MALLOC_ENTER, False),
                     format_event(MALLOC_EXIT, False)]
    assert out.getvalue().endswith("\n")


def test_text_headers():
    assert HEADER_WITH_TIME.split() == ["TIME", "PROCESS", "PID", "EVENT", "TYPE", "DETAILS"]
    assert HEADER_NO_TIME.split() == ["PROCESS", "PID", "EVENT", "TYPE", "DETAILS"]


def test_text_writer_asks_the_namer_only_for_launches():
    asked = []

    def namer(event, address):
        asked.append((event.api, address))
        return "vec_add"

    out = io.StringIO()
    TextWriter(out, timestamps=False, namer=namer).write(
        [MALLOC_ENTER, _event("cudaLaunchKernel", ENTER, LAUNCH_ARGS)])
    assert asked == [("cudaLaunchKernel", 0x401136)]
    assert "func=vec_add grid=(4,1,1)" in out.getvalue()


def test_json_enter_object():
    assert json.loads(json.dumps(MALLOC_ENTER.to_json())) == {
        "ts": TS, "pid": 4242, "tid": 4242, "comm": "basic02", "api": "cudaMalloc",
        "phase": "enter", "args": {"size": 4000}}


def test_json_exit_object_has_outs_as_top_level_keys():
    assert MALLOC_EXIT.to_json() == {
        "ts": TS, "pid": 4242, "tid": 4242, "comm": "basic02", "api": "cudaMalloc",
        "phase": "exit", "args": {"size": 4000}, "ret": 0, "ret_name": "cudaSuccess",
        "duration_ns": 12_345, "ptr": 0x7F0000000000}


def test_json_dim3_become_lists_and_faults_are_listed():
    launch = _exit("cudaLaunchKernel", LAUNCH_ARGS)
    assert launch.to_json()["args"]["grid"] == [4, 1, 1]
    assert "faults" not in launch.to_json()
    faulted = _exit("cudaStreamCreate", {}, faults=("stream",))
    assert faulted.to_json()["faults"] == ["stream"]
    assert "stream" not in faulted.to_json()


def test_json_writer_one_compact_object_per_line():
    out = io.StringIO()
    writer = JsonWriter(out)
    writer.header()
    writer.write([MALLOC_ENTER, MALLOC_EXIT])
    writer.write([])
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and out.getvalue().endswith("\n")
    assert [json.loads(line) for line in lines] == [MALLOC_ENTER.to_json(),
                                                    MALLOC_EXIT.to_json()]
    assert ": " not in lines[0] and ", " not in lines[0]
