"""The stand-in libcudart and the driver program, run without any tracing.

These pin down the values that end-to-end tracer tests compare against.
"""
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from fakecuda import (DEVICE_COUNT, ELAPSED_MS, EVENT_BASE, EXEC_BASE, FAKE_FUNCTIONS,
                      GRAPH_BASE, MEM_FREE, MEM_TOTAL, SONAME, STREAM_BASE, build_driver_prog,
                      device_ptr, host_ptr, parse_output, run_driver,
                      wheel_libcudart)

CUDA_CALLS = Path(__file__).resolve().parent.parent / "examples" / "cuda_calls.py"
PUSH_RBP = b"\x55"
ENDBR64 = b"\xf3\x0f\x1e\xfa"


def _dynamic_functions(path):
    """{name: (address, first 5 bytes)} of the defined dynamic function symbols."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        text = elf.get_section_by_name(".text")
        data, base = text.data(), text["sh_addr"]
        found = {}
        for sym in elf.get_section_by_name(".dynsym").iter_symbols():
            if sym["st_info"]["type"] == "STT_FUNC" and sym["st_shndx"] != "SHN_UNDEF":
                offset = sym["st_value"] - base
                found[sym.name] = (sym["st_value"], data[offset:offset + 5])
        return found


def test_library_has_the_real_soname_and_symbol_version(lib):
    with open(lib, "rb") as f:
        elf = ELFFile(f)
        dynamic = elf.get_section_by_name(".dynamic")
        sonames = [tag.soname for tag in dynamic.iter_tags() if tag.entry.d_tag == "DT_SONAME"]
        definitions = elf.get_section_by_name(".gnu.version_d").iter_versions()
        versions = [aux.name for _, auxes in definitions for aux in auxes]
    assert sonames == [SONAME]
    assert SONAME in versions


def test_exports_every_function_at_its_own_address(lib):
    functions = _dynamic_functions(lib)
    assert set(FAKE_FUNCTIONS) <= set(functions)
    addresses = [functions[name][0] for name in FAKE_FUNCTIONS]
    assert len(set(addresses)) == len(addresses), "two exported functions share an address"
    assert all(not name.startswith("cuda") or name in FAKE_FUNCTIONS for name in functions)


def test_every_exported_function_begins_with_push_rbp(lib):
    functions = _dynamic_functions(lib)
    wrong = {name: code.hex() for name, (_, code) in functions.items()
             if not code.startswith(PUSH_RBP)}
    assert wrong == {}


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump is not installed")
def test_objdump_agrees_first_instruction_is_push_rbp(lib):
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)],
                             capture_output=True, text=True, check=True).stdout
    first = dict(re.findall(r"^[0-9a-f]+ <(cuda\w+)>:\n\s+[0-9a-f]+:\s+(.+?)\s*$", listing,
                            re.MULTILINE))
    assert set(FAKE_FUNCTIONS) <= set(first)
    assert {name: insn for name, insn in first.items() if insn != "push   %rbp"} == {}


def test_seed_program_sees_deterministic_results(prog):
    calls = run_driver(prog, [
        "getdevice", "setdevice:0", "malloc:4000", "malloc:4000", "malloc:4000",
        "memcpy:4000:1", "memcpy:4000:1:@1", "launch:4:256", "memcpy:4000:2",
        "streamcreate", "eventcreate", "eventrecord:last:last", "eventsync:last",
        "streamsync:last", "free:@0", "free:@1", "free:@2",
    ])
    by_op = [(c.op, c.ret, c.out) for c in calls]
    assert by_op == [
        ("getdevice", 0, 0), ("setdevice", 0, None),
        ("malloc", 0, device_ptr(0)), ("malloc", 0, device_ptr(1)), ("malloc", 0, device_ptr(2)),
        ("memcpy", 0, None), ("memcpy", 0, None), ("launch", 0, None), ("memcpy", 0, None),
        ("streamcreate", 0, STREAM_BASE), ("eventcreate", 0, EVENT_BASE),
        ("eventrecord", 0, None), ("eventsync", 0, None), ("streamsync", 0, None),
        ("free", 0, None), ("free", 0, None), ("free", 0, None),
    ]
    h2d, h2d_b, launch, d2h = calls[5], calls[6], calls[7], calls[8]
    assert (h2d.number("dst"), h2d.number("count"), h2d.number("kind")) == (device_ptr(2), 4000, 1)
    assert h2d_b.number("dst") == device_ptr(1)
    assert d2h.number("src") == device_ptr(2) and d2h.number("dst") == h2d.number("src")
    assert launch.fn == "cudaLaunchKernel"
    assert (launch.fields["grid"], launch.fields["block"]) == ("4,1,1", "256,1,1")
    assert launch.number("func") != 0 and launch.number("stream") == 0
    assert calls[11].number("event") == EVENT_BASE and calls[11].number("stream") == STREAM_BASE
    assert [c.number("ptr") for c in calls[14:]] == [device_ptr(0), device_ptr(1), device_ptr(2)]


@pytest.mark.parametrize("ops, fn, ret", [
    (["malloc:0x20000000000"], "cudaMalloc", 2),
    (["memcpy:8:5"], "cudaMemcpy", 21),
    (["memcpyptds:8:7"], "cudaMemcpy_ptds", 21),
    (["memcpyasync:8:9"], "cudaMemcpyAsync", 21),
    (["memcpyasyncptsz:8:9"], "cudaMemcpyAsync_ptsz", 21),
    (["memcpy2d:600:2:1"], "cudaMemcpy2D", 12),
    (["memcpy2d:100:2:5"], "cudaMemcpy2D", 21),
    (["memcpy2dasync:600:2:1"], "cudaMemcpy2DAsync", 12),
    (["memcpypeer:8:0:2"], "cudaMemcpyPeer", 101),
    (["launch:1:2048"], "cudaLaunchKernel", 9),
    (["launch:1:32,32,2"], "cudaLaunchKernel", 9),
    (["launch:0:32"], "cudaLaunchKernel", 9),
    (["launchnull:1:32"], "cudaLaunchKernel", 98),
    (["launchptsz:1:1025"], "cudaLaunchKernel_ptsz", 9),
    (["coop:1:1025"], "cudaLaunchCooperativeKernel", 9),
    (["launchex:1:1025"], "cudaLaunchKernelExC", 9),
    (["setdevice:2"], "cudaSetDevice", 101),
    (["setdevice:-1"], "cudaSetDevice", 101),
    (["mallocmanaged:8:0"], "cudaMallocManaged", 1),
    (["hostalloc:8:16"], "cudaHostAlloc", 1),
    (["streamcreateflags:2"], "cudaStreamCreateWithFlags", 1),
    (["streamcreateprio:0:1"], "cudaStreamCreateWithPriority", 1),
    (["streamdestroy:0"], "cudaStreamDestroy", 400),
    (["streamwait:0:0"], "cudaStreamWaitEvent", 400),
    (["streamquery:0x5001"], "cudaStreamQuery", 600),
    (["eventcreateflags:16"], "cudaEventCreateWithFlags", 1),
    (["eventrecord:0"], "cudaEventRecord", 400),
    (["eventrecordptsz:0"], "cudaEventRecord_ptsz", 400),
    (["eventsync:0"], "cudaEventSynchronize", 400),
    (["eventquery:0"], "cudaEventQuery", 400),
    (["eventquery:0xe001"], "cudaEventQuery", 600),
    (["eventdestroy:0"], "cudaEventDestroy", 400),
    (["elapsed:0:0xe000"], "cudaEventElapsedTime", 400),
    (["capture:0x5000:3"], "cudaStreamBeginCapture", 1),
    (["instantiate:0"], "cudaGraphInstantiate", 1),
    (["graphlaunch:0"], "cudaGraphLaunch", 400),
])
def test_documented_failures(prog, ops, fn, ret):
    call = run_driver(prog, ops)[-1]
    assert (call.fn, call.ret) == (fn, ret)


def test_failed_allocation_leaves_out_parameter_and_counter_alone(prog):
    calls = run_driver(prog, ["malloc:0x20000000000", "malloc:8", "malloc:0", "malloc:8"])
    assert [(c.ret, c.out) for c in calls] == [(2, 0), (0, device_ptr(0)), (0, 0),
                                               (0, device_ptr(1))]


def test_more_out_parameters(prog):
    calls = run_driver(prog, [
        "getdevicecount", "meminfo", "mallocmanaged:64", "mallocasync:64", "mallocpitch:100:3",
        "mallochost:64", "hostalloc:64:1", "streamcreateflags:1", "streamcreateprio:1:-2",
        "eventcreateflags:2", "eventcreate", "elapsed:@0:@1", "streamcreate", "capture:last",
        "endcapture:last", "instantiate", "graphlaunch", "setdevice:1", "getdevice",
    ])
    out = {c.op: c for c in calls}
    assert out["getdevicecount"].out == DEVICE_COUNT
    assert (out["meminfo"].out, out["meminfo"].number("total")) == (MEM_FREE, MEM_TOTAL)
    assert [c.out for c in calls[2:5]] == [device_ptr(0), device_ptr(1), device_ptr(2)]
    assert out["mallocpitch"].number("pitch") == 512
    assert [c.out for c in calls[5:7]] == [host_ptr(0), host_ptr(1)]
    assert [c.out for c in calls[7:9]] == [STREAM_BASE, STREAM_BASE + 1]
    assert [c.out for c in calls[9:11]] == [EVENT_BASE, EVENT_BASE + 1]
    assert struct.unpack("<f", struct.pack("<I", out["elapsed"].out))[0] == ELAPSED_MS
    assert out["streamcreate"].out == STREAM_BASE + 2
    assert out["endcapture"].out == GRAPH_BASE
    assert out["instantiate"].out == EXEC_BASE and out["instantiate"].number("graph") == GRAPH_BASE
    assert out["graphlaunch"].ret == 0 and out["graphlaunch"].number("exec") == EXEC_BASE
    assert out["getdevice"].out == 1
    assert all(c.ret == 0 for c in calls)


def test_last_error_is_kept_until_read(prog):
    calls = run_driver(prog, ["peeklasterror", "setdevice:9", "getdevice", "peeklasterror",
                              "getlasterror", "getlasterror"])
    assert [c.ret for c in calls] == [0, 101, 0, 101, 101, 0]


def test_loop_and_threads_count_calls(prog):
    calls = run_driver(prog, ["loop:1000:malloc:8", "threads:4:2500:launch:1:32",
                              "threads:2:10:setdevice:5"])
    assert [(c.op, c.fn, c.number("n"), c.number("errors")) for c in calls] == [
        ("loop", "cudaMalloc", 1000, 0), ("threads", "cudaLaunchKernel", 10000, 0),
        ("threads", "cudaSetDevice", 20, 20)]
    assert calls[2].ret == 101


def test_malformed_op_exits_2(prog):
    for ops in (["nosuchop"], ["malloc"], ["malloc:12x"], ["free:@0"], ["launch:1"]):
        done = subprocess.run([str(prog), *ops], capture_output=True, text=True)
        assert done.returncode == 2, ops
        assert "cuda_driver_prog:" in done.stderr


def test_wait_stdin_then_launch_symbolizes_to_vec_add_kernel(prog):
    with open(prog, "rb") as f:
        symbols = ELFFile(f).get_section_by_name(".symtab")
        kernel = symbols.get_symbol_by_name("vec_add_kernel")[0]["st_value"]
    proc = subprocess.Popen([str(prog), "--wait-stdin", "launch:4:256"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        ready = proc.stdout.readline()
        assert ready == "ready pid=%d\n" % proc.pid
        with open("/proc/%d/maps" % proc.pid) as maps:
            base = min(int(line.split("-")[0], 16) for line in maps
                       if line.rstrip().endswith(str(prog.resolve())))
        rest, _ = proc.communicate("go\n", timeout=30)
    finally:
        proc.kill()
        proc.wait()
    launch = parse_output(rest)[0]
    assert launch.number("func") - base == kernel


def test_driver_program_also_runs_against_nvidias_libcudart(cc):
    real = wheel_libcudart()
    if real is None:
        pytest.skip("nvidia-cuda-runtime-cu12 is not installed")
    prog = build_driver_prog(cc, real, "cuda_driver_prog_real")
    calls = run_driver(prog, ["getdevicecount", "malloc:4000", "free:0"])
    assert [c.fn for c in calls] == ["cudaGetDeviceCount", "cudaMalloc", "cudaFree"]
    if calls[0].ret == 0:          # a host with a GPU and its driver
        assert calls[0].out >= 1
    else:                          # no driver (35), no device (100) or the stub library (34)
        assert calls[0].ret in (34, 35, 100)


def test_cuda_calls_example_against_the_stand_in(lib):
    done = subprocess.run([sys.executable, str(CUDA_CALLS), str(lib)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    results = re.findall(r"^(cuda\w+)\(.*?-> (\d+) ", done.stdout, re.MULTILINE)
    assert ("cudaMalloc", "0") in results and ("cudaLaunchKernel", "98") in results
    assert "dev = %#x" % device_ptr(0) in done.stdout


def test_cuda_calls_example_against_nvidias_libcudart():
    real = wheel_libcudart()
    if real is None:
        pytest.skip("nvidia-cuda-runtime-cu12 is not installed")
    done = subprocess.run([sys.executable, str(CUDA_CALLS), str(real)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(re.findall(r"^cuda\w+\(.*-> \d+ ", done.stdout, re.MULTILINE)) == 15
