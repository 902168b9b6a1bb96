"""The Python API for embedding: a quiet import, lazy public names, typed events from the
stand-in runtime, callbacks, analyses and writers fed by any iterable, errors raised (never
printed, never exiting)."""
import io
import json
import subprocess
import sys

import pytest

import ebpf_cuda
from ebpf_cuda.decode.events import ENTER, EXIT, Event

FUNCTIONS = ["cudaMalloc", "cudaFree", "cudaMemcpy", "cudaLaunchKernel", "cudaSetDevice"]
OPS = ["malloc:4000", "memcpy:4000:1", "launch:2,1,1:64", "free", "free", "malloc:64",
       "setdevice:5"]


def test_import_loads_nothing_else_and_not_click():
    code = ("import sys, ebpf_cuda\n"
            "assert 'click' not in sys.modules\n"
            "assert [m for m in sys.modules if m.startswith('ebpf_cuda')] == ['ebpf_cuda']\n"
            "for name in ebpf_cuda.__all__: getattr(ebpf_cuda, name)\n"
            "assert 'click' not in sys.modules, 'a public name pulled click in'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_public_names_are_the_documented_objects():
    from ebpf_cuda.tracer import Tracer

    assert ebpf_cuda.Tracer is Tracer and ebpf_cuda.Event is Event
    assert "Tracer" in dir(ebpf_cuda) and "load" in ebpf_cuda.__all__
    with pytest.raises(AttributeError):
        ebpf_cuda.no_such_name  # noqa: B018


def test_bad_arguments_raise_typed_errors_without_printing(capsys):
    with pytest.raises(ebpf_cuda.UsageError, match="unknown function"):
        ebpf_cuda.Tracer(functions=["cudaNoSuchCall"])
    with pytest.raises(ebpf_cuda.UsageError):
        ebpf_cuda.Tracer(pid=1, command=["true"])
    assert capsys.readouterr() == ("", "")


def test_a_trace_config_is_given_whole_or_by_its_keywords():
    config = ebpf_cuda.TraceConfig(command=["./app"], functions=["cudaMalloc"])
    assert config.command == ("./app",) and config.functions == ("cudaMalloc",)
    assert ebpf_cuda.Tracer(config).config is config
    by_keywords = ebpf_cuda.Tracer(command=["./app"], functions=["cudaMalloc"])
    assert by_keywords.config == config and by_keywords.command == ["./app"]
    with pytest.raises(TypeError, match="not both"):
        ebpf_cuda.Tracer(config, pid=1)
    with pytest.raises(TypeError):
        ebpf_cuda.Tracer(["cudaMalloc"])  # (the keywords are no longer positional)
    with pytest.raises(TypeError):
        ebpf_cuda.Tracer(no_such_keyword=1)


@pytest.fixture(scope="module")
def stand_in(cc):
    from fakecuda import build_fake_cuda

    return build_fake_cuda(cc)


@pytest.fixture(scope="module")
def traced(stand_in):
    lib, prog = stand_in
    with ebpf_cuda.Tracer(command=[str(prog), *OPS], functions=FUNCTIONS,
                          library=[str(lib)]) as tracer:
        events = list(tracer.events(timeout=30))
        assert tracer.stats()["lost"] == 0
    return events


@pytest.mark.kernel
def test_events_are_typed(traced):
    from fakecuda import device_ptr

    calls = [ev for ev in traced if ev.phase == EXIT]
    assert [ev.api for ev in calls] == ["cudaMalloc", "cudaMemcpy", "cudaLaunchKernel",
                                        "cudaFree", "cudaFree", "cudaMalloc", "cudaSetDevice"]
    assert all(isinstance(ev, Event) for ev in traced)
    malloc = calls[0]
    assert malloc.args == {"size": 4000} and malloc.outs == {"ptr": device_ptr(0)}
    assert malloc.ret == 0 and malloc.ret_name == "cudaSuccess"
    assert isinstance(malloc.duration_ns, int) and malloc.duration_ns > 0
    assert calls[1].args["kind"] == "HostToDevice"
    assert calls[2].args["grid"] == (2, 1, 1) and calls[2].args["block"] == (64, 1, 1)
    assert calls[-1].ret == 101 and calls[-1].ret_name == "cudaErrorInvalidDevice"
    assert [ev.phase for ev in traced[:2]] == [ENTER, EXIT]
    assert json.dumps([ev.to_json() for ev in traced])


@pytest.mark.kernel
def test_the_closing_says_how_the_trace_ends(stand_in):
    lib, _ = stand_in
    with ebpf_cuda.Tracer(command=["sh", "-c", "exit 3"], functions=FUNCTIONS,
                          library=[str(lib)]) as tracer:
        tracer.trace_into([])
        closing = tracer.closing()
    assert closing.exit_status == 3 and closing.left_running == []
    assert closing.losses.read().total == 0 and closing.lines == []


def test_on_event_calls_back_until_the_end(stand_in):
    lib, prog = stand_in
    seen = []
    with ebpf_cuda.Tracer(command=[str(prog), "malloc:8", "free"],
                          functions=["cudaMalloc", "cudaFree"], library=[str(lib)]) as tracer:
        assert tracer.on_event(seen.append, timeout=30) is None
        assert tracer.exit_status == 0
    assert [(ev.api, ev.phase) for ev in seen] == [
        ("cudaMalloc", ENTER), ("cudaMalloc", EXIT), ("cudaFree", ENTER), ("cudaFree", EXIT)]


@pytest.mark.kernel
def test_analyses_and_writers_take_any_iterable(traced):
    summary = ebpf_cuda.Summary()
    summary.add(iter(traced))
    assert "cudaMalloc" in summary.report()

    leaks = ebpf_cuda.LeakTracker()
    warnings = leaks.feed_all(iter(traced))
    assert [w.kind for w in warnings] == ["double-free"]
    assert [a.size for a in leaks.leaks()] == [64]

    timeline, page = io.StringIO(), io.StringIO()
    timeline.close = page.close = lambda: None
    ebpf_cuda.write_chrome_trace(iter(traced), timeline)
    names = {e["name"] for e in json.loads(timeline.getvalue())}
    assert {"cudaMalloc", "double free", "leak", "cudaErrorInvalidDevice"} <= names
    ebpf_cuda.write_html_report(iter(traced), page)
    assert "cudaLaunchKernel" in page.getvalue()


@pytest.mark.kernel
def test_saved_trace_through_the_api(stand_in, tmp_path):
    lib, prog = stand_in
    path = str(tmp_path / "run.ebpfcuda")
    with ebpf_cuda.Tracer(command=[str(prog), *OPS], functions=FUNCTIONS,
                          library=[str(lib)]) as tracer:
        live = []
        with ebpf_cuda.open_save(path, tracer.apis_table,
                                 tracer.decoder.clock_offset_ns) as saver:
            saver.from_start = True  # (a command's: its threads begin on device 0)
            for frames in tracer.frames(timeout=30):
                saver.write_frames(frames)
                live += tracer.stream.decode(frames)  # (annotated: names, devices)
    replayed = list(ebpf_cuda.load(path))
    assert replayed == live and len(live) == 2 * len(OPS)
    assert [e.device for e in live if e.api == "cudaMalloc"] == [0, 0, 0, 0]


@pytest.mark.kernel
def test_every_command_line_output_from_a_request(stand_in, tmp_path):
    """docs/api.md's example: the outputs of `-o FILE --summary --leaks --save FILE` made
    from a plan.Request, live, then the same sinks fed again from the saved trace."""
    from ebpf_cuda.output import plan, savefile

    lib, prog = stand_in
    request = plan.Request(output=str(tmp_path / "calls.txt"), summary=True, leaks=True,
                           save=str(tmp_path / "run.ebpfcuda"))
    with ebpf_cuda.Tracer(command=[str(prog), *OPS], functions=FUNCTIONS,
                          library=[str(lib)]) as tracer:
        outputs = plan.for_trace(request, tracer)
        assert outputs.spool is None  # (--save: no spool, the events are decoded once)
        tracer.trace_into(outputs.sinks, save=outputs.saver, spool=outputs.spool)
        summary, leaks = outputs.reports(tracer)
    lines = (tmp_path / "calls.txt").read_text().splitlines()
    assert len([line for line in lines if "[EXIT]" in line]) == len(OPS)
    api_table = summary.split(" ** ")[1]  # (time %, total, calls, ..., name)
    calls = {row.split()[-1]: int(row.split()[2].replace(",", ""))
             for row in api_table.splitlines() if row.split()[-1:] in ([f] for f in FUNCTIONS)}
    assert calls == {"cudaMalloc": 2, "cudaFree": 2, "cudaMemcpy": 1, "cudaLaunchKernel": 1,
                     "cudaSetDevice": 1}
    assert "64 bytes" in leaks or "64 B" in leaks
    again = plan.Request(output=str(tmp_path / "again.txt"), summary=True)
    saved = savefile.load(request.save)
    made = plan.for_replay(again, saved)
    outputs_again, losses, _ = plan.replay(saved, made.sinks)
    assert not outputs_again.failures and losses.total == 0
    assert (tmp_path / "again.txt").read_text().splitlines() == lines
    assert made.reports()[0] == summary
