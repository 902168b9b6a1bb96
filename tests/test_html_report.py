"""The HTML report: one self-contained page (parsed with html.parser), the expected numbers,
no external references; rendered by headless Chromium when it is installed."""
import io
import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser

import pytest

from ebpf_cuda.output.html_report import MAX_BUCKETS, HtmlReport, TimeSeries, write_html_report
from test_chrome_trace import DEV, call, sample_events

NAMER = lambda ev, addr: "vec_add" if addr == 0x4010 else None  # noqa: E731


class Page(HTMLParser):
    """Tags, attributes, cell texts and table rows of a page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags, self.attrs, self.texts, self.rows = [], [], [], []
        self._row = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend(attrs)
        if tag == "tr":
            self._row = []
            self.rows.append(self._row)

    def handle_endtag(self, tag):
        if tag == "tr":
            self._row = None

    def handle_data(self, data):
        if data.strip():
            self.texts.append(data.strip())
            if self._row is not None:
                self._row.append(data.strip())


def render(events) -> str:
    stream = io.StringIO()
    stream.close = lambda: None
    write_html_report(events, stream, namer=NAMER)
    return stream.getvalue()


@pytest.fixture(scope="module")
def page():
    return Page(render(sample_events()))


def row(page, first):
    return next(r for r in page.rows if r and r[0] == first)


def test_is_one_self_contained_page(page):
    assert page.tags[0] == "html" and "svg" in page.tags and "table" in page.tags
    assert not {"script", "link", "img", "iframe", "object", "embed"} & set(page.tags)
    for name, value in page.attrs:
        assert name not in ("src", "href"), (name, value)
        assert "://" not in (value or ""), (name, value)
    assert not any("http" in text for text in page.texts)


def test_summary_numbers(page):
    assert row(page, "events") == ["events", "16"]
    assert row(page, "calls") == ["calls", "8"]
    assert row(page, "failed calls") == ["failed calls", "1"]
    assert row(page, "cudaMalloc")[:3] == ["cudaMalloc", "2", "0"]
    assert row(page, "cudaMemcpy")[:3] == ["cudaMemcpy", "2", "0"]
    assert row(page, "cudaSetDevice")[:3] == ["cudaSetDevice", "1", "1"]
    assert row(page, "Host-to-Device")[:3] == ["Host-to-Device", "1", "4000"]
    assert row(page, "Device-to-Host")[:3] == ["Device-to-Host", "1", "10"]


def test_memory_leaks_kernels_and_errors(page):
    assert row(page, "100") == ["100", "app", "4100", "100", "1"]  # pid, peak, live, leaks
    assert "double frees: 1" in page.texts
    assert hex(DEV + 0x100000) in page.texts
    assert row(page, "vec_add")[:2] == ["vec_add", "1"]
    assert row(page, "cudaSetDevice") and ["cudaSetDevice", "cudaErrorInvalidValue", "1"] in \
        page.rows


def test_plots_are_inline_svg_with_a_histogram_per_function(page):
    captions = [t for t in page.texts if "log2 buckets" in t]
    assert len(captions) == 5
    assert any(t.startswith("calls per") for t in page.texts)
    assert any(t.startswith("bytes copied per") for t in page.texts)


def test_empty_report_is_still_a_page():
    empty = Page(render([]))
    assert row(empty, "calls") == ["calls", "0"] and "svg" not in empty.tags


def test_time_buckets_widen_to_stay_bounded():
    series = TimeSeries(["calls", "live"])
    for i in range(10_000):
        series.add(i * 1_000_000, (1, i), keep_max=(False, True))
    assert len(series.buckets) <= MAX_BUCKETS
    assert sum(series.column("calls")) == 10_000
    assert max(series.column("live")) == 9_999


def test_sink_interface_writes_at_close():
    stream = io.StringIO()
    stream.close = lambda: None
    report = HtmlReport(stream)
    report.header()
    report.write(call("cudaMalloc", {"size": 8}, 1000, outs={"ptr": DEV}))
    assert stream.getvalue() == ""
    report.close()
    assert stream.getvalue().startswith("<!DOCTYPE html>")


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed")
def test_chromium_renders_it_without_errors(tmp_path):
    page_path = tmp_path / "report.html"
    page_path.write_text(render(sample_events()))
    shot = tmp_path / "shot.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", "--enable-logging=stderr", "--v=0",
             "--user-data-dir=" + tempfile.mkdtemp(dir=str(tmp_path))]
    dom = subprocess.run([_chromium(), *flags, "--dump-dom", page_path.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert "Calls by function" in dom.stdout and "<svg" in dom.stdout
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line or "net::" in line]
    assert console == []
    subprocess.run([_chromium(), *flags, "--window-size=1200,2000",
                    "--screenshot=" + str(shot), page_path.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.exists() and os.path.getsize(shot) > 10_000


def _layered(outer, inner, ts_ns, outs=None):
    """A runtime call and the driver call inside it (the driver call returns first)."""
    return (call(inner[0], inner[1], ts_ns + 200, duration_ns=500, outs=outs)
            + call(outer[0], outer[1], ts_ns, duration_ns=1000, outs=outs))


def test_both_layers_count_once_as_in_the_summary_and_the_leak_report():
    """Formerly the page counted a cudaMemcpy and its cuMemcpyHtoD_v2 as two copies (H200,
    PyTorch: 12 calls, 201,400,320 bytes for 6, 100.7 MB) and each cudaFree after its
    cuMemFree_v2 as a double free (18 where --leaks found none)."""
    events = []
    events += _layered(("cudaMalloc", {"size": 4000}), ("cuMemAlloc_v2", {"size": 4000}),
                       1_000_000, outs={"ptr": DEV})
    for i in range(3):
        events += _layered(("cudaMemcpy", {"dst": DEV, "src": 0x1000, "size": 4000,
                                           "kind": "HostToDevice"}),
                           ("cuMemcpyHtoD_v2", {"dst": DEV, "src": 0x1000, "size": 4000}),
                           2_000_000 + i * 10_000)
    events += call("cuMemcpyDtoH_v2", {"dst": 0x1000, "src": DEV, "size": 10}, 3_000_000)
    events += _layered(("cudaFree", {"ptr": DEV}), ("cuMemFree_v2", {"ptr": DEV}), 4_000_000)
    page = Page(render(events))
    assert row(page, "Host-to-Device")[:3] == ["Host-to-Device", "3", "12000"]
    assert row(page, "Device-to-Host")[:3] == ["Device-to-Host", "1", "10"]
    assert "double frees: 0" in page.texts and "allocations: 1" in page.texts
    assert "frees: 1" in page.texts
    assert row(page, "100")[2:] == ["4000", "0", "0"]  # peak, live at end, leaks


def test_the_page_says_what_the_trace_lost():
    import io

    from ebpf_cuda.decode.losses import Losses
    from ebpf_cuda.output.html_report import HtmlReport

    class Keep(io.StringIO):
        def close(self):
            self.text = self.getvalue()
            super().close()

    out = Keep()
    report = HtmlReport(out)
    report.header()
    report.note_losses(Losses(ring_full=1200))
    report.close()
    assert ("<strong>Not counted:</strong> 1200 events lost: 1200 with the ring buffer full "
            "(try --ring-size)") in out.text


def _graph_launch(ts_ns, nodes):
    """cudaGraphLaunch and the cuGraphLaunch inside it, both annotated with the nodes run."""
    return _layered(("cudaGraphLaunch", {"graphExec": 0x7000, "stream": 0}),
                    ("cuGraphLaunch", {"hGraphExec": 0x7000, "hStream": 0}), ts_ns,
                    outs={"nodes": nodes})


def test_kernels_count_as_run_by_graph_launches_and_captured_apart_as_in_the_summary():
    """Formerly a launch recorded into a graph by a stream capture counted as a launch that
    ran, and the kernels graph launches ran counted nowhere."""
    from ebpf_cuda.analysis.summary import Summary

    kernel = {"type": "kernel", "func": 0x4010, "kernel": "vec_add", "grid": [1, 1, 1],
              "block": [32, 1, 1], "smem": 0}
    other = dict(kernel, func=0x5000, kernel="k2")
    nodes = [kernel, other, {"type": "memcpy", "size": 8, "kind": "HostToDevice"},
             {"type": "graph", "nodes": [kernel]}]
    launch = {"func": 0x4010, "grid": (1, 1, 1), "block": (32, 1, 1), "smem": 0, "stream": 5}
    events = []
    for i in range(2):  # recorded into the graph, not run then
        events += call("cudaLaunchKernel", launch, 1_000_000 + i * 1000, outs={"captured": True})
    for i in range(3):
        events += _graph_launch(2_000_000 + i * 10_000, nodes)
    events += call("cudaLaunchKernel", launch, 3_000_000)  # eager
    page = Page(render(events))
    assert page.rows[[r[:1] for r in page.rows].index(["kernel"])][:4] == [
        "kernel", "launches", "in graphs", "captured"]
    assert row(page, "vec_add")[:4] == ["vec_add", "7", "6", "2"]
    assert row(page, "k2")[:4] == ["k2", "3", "3", "0"]
    summary = Summary(NAMER)
    summary.add(events)
    by_name = {}
    names = summary.kernel_names()
    for column, counts in enumerate((summary.launches, summary.in_graphs, summary.captured)):
        for (pid, func, *_), count in counts.items():
            by_name.setdefault(names[(pid, func)], [0, 0, 0])[column] += count
    assert by_name == {"vec_add": [7, 6, 2], "k2": [3, 3, 0]}


def test_without_graphs_the_kernel_table_is_as_it_was(page):
    header = page.rows[[r[:1] for r in page.rows].index(["kernel"])]
    assert header == ["kernel", "launches", "launch calls total (ms)"]
