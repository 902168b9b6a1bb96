"""stream.py: the one read loop, reached through `Tracer.trace_into` as a library user would.

Every way of delivering a batch (spooled lines, inline lines, decoded events) prints the same
lines for the same calls, names included, and the spooled path is the library's as much as
the CLI's."""
import io
import re

import pytest

from ebpf_cuda.output.jsonl import JsonWriter
from ebpf_cuda.output.text import TextWriter
from ebpf_cuda.output.spool import Spool
from ebpf_cuda.tracer import Tracer
from fakecuda_driver import build_fake_driver, function_handle
from helpers import stdout_to

pytestmark = pytest.mark.kernel

OPS = ["init", "moduleload", "getfunction:vec_add", "launch:2,1,1:64,1,1", "malloc:4000",
       "memcpy:4000:1", "free"]


@pytest.fixture(scope="module")
def driver(cc):
    return build_fake_driver(cc)


class Collect(io.StringIO):
    def close(self):  # the writer closes its stream at the end: keep the text
        self.text = self.getvalue()
        super().close()


def _lines(driver, tmp_path, make_writer, **deliver):
    lib, prog = driver
    out = Collect()
    with Tracer(command=[str(prog), *OPS], library=[str(lib)]) as tracer:
        writer = make_writer(out, tracer)
        with stdout_to(str(tmp_path / "program.out")):
            tracer.start()
        tracer.trace_into([writer], **deliver)
        assert tracer.exit_status == 0 and tracer.lost == 0
    return out.text.splitlines()


def _text(out, tracer):
    return TextWriter(out, timestamps=False, namer=tracer.names)


def _json(out, tracer):
    return JsonWriter(out, namer=tracer.names)


def _comparable(lines):
    """Without pids, times, durations and the module image's address (ASLR): they differ
    from one run to the next."""
    return [re.sub(r'\(\d+\.\d+ us\)|"(ts|pid|tid|duration_ns|image)":[\d.]+|image=0x\w+|'
                   r'^\S+\s+\d+\s+', "", line) for line in lines]


@pytest.mark.parametrize("make_writer", [_text, _json], ids=["text", "json"])
def test_spooled_inline_and_decoded_lines_are_the_same(driver, tmp_path, make_writer):
    spooled = _lines(driver, tmp_path, make_writer, spool=Spool())
    inline = _lines(driver, tmp_path, make_writer)
    extra = []  # a second sink makes the stream decode events for every sink

    class Count:
        def header(self):
            pass

        def write(self, events):
            extra.extend(events)

        def close(self):
            pass

    lib, prog = driver
    out = Collect()
    with Tracer(command=[str(prog), *OPS], library=[str(lib)]) as tracer:
        with stdout_to(str(tmp_path / "program.out")):
            tracer.start()
        tracer.trace_into([make_writer(out, tracer), Count()])
    decoded = out.text.splitlines()
    assert _comparable(spooled) == _comparable(inline) == _comparable(decoded)
    assert len(extra) == 2 * 7  # enter and exit of each call
    assert sum("vec_add" in line for line in spooled) >= 2  # the name taught, and the launch


def test_the_launch_is_named_and_the_teaching_call_shows_the_name(driver, tmp_path):
    lines = _lines(driver, tmp_path, _text, spool=Spool())
    get = [l for l in lines if "cuModuleGetFunction" in l and "[EXIT]" in l]
    launch = [l for l in lines if "cuLaunchKernel" in l and "[ENTER]" in l]
    assert "kernel_name=vec_add" in get[0]
    assert "func=vec_add" in launch[0] and hex(function_handle(0)) not in launch[0]
