"""A real Prometheus server (Debian's `prometheus` package) scrapes `ebpf-cuda monitor`
every second while stand-in processes, started before and after the monitor, make known
calls; PromQL through Prometheus's HTTP API gives exactly those counts, bytes and errors,
also after the processes exited. Plus the exposition format itself (pure logic)."""
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest

from ebpf_cuda.monitor import prometheus
from ebpf_cuda.monitor.metrics import Family, histogram
from monitor_support import AFTER, BEFORE, KERNEL, Held, MonitorCli

PROMETHEUS = shutil.which("prometheus")
WAIT_S = 30  # for a value to show in Prometheus (it scrapes every second)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A Prometheus server of its own (loopback port, storage in tmp_path) scraping
    127.0.0.1:`target` every second."""

    def __init__(self, tmp_path, target: int) -> None:
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
            "scrape_configs:\n  - job_name: ebpf-cuda\n    static_configs:\n"
            "      - targets: ['127.0.0.1:%d']\n" % target)
        self.port = free_port()
        self.log = open(tmp_path / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, "--config.file=%s" % config,
             "--storage.tsdb.path=%s" % (tmp_path / "tsdb"),
             "--web.listen-address=127.0.0.1:%d" % self.port, "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not self._ready():
            assert self.proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "prometheus did not get ready"
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/-/ready" % self.port, timeout=2):
                return True
        except OSError:
            return False

    def query(self, promql: str) -> list:
        """The result of an instant query (a list of {"metric", "value"})."""
        url = "http://127.0.0.1:%d/api/v1/query?%s" % (
            self.port, urllib.parse.urlencode({"query": promql}))
        with urllib.request.urlopen(url, timeout=10) as answer:
            reply = json.load(answer)
        assert reply["status"] == "success", reply
        return reply["data"]["result"]

    def number(self, promql: str):
        """The query's single value as a number, None when it has no result."""
        result = self.query(promql)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, promql: str, expected) -> None:
        """Until the query gives `expected` (None: no result); fails after WAIT_S."""
        deadline = time.monotonic() + WAIT_S
        got = self.number(promql)
        while got != expected and time.monotonic() < deadline:
            time.sleep(0.3)
            got = self.number(promql)
        assert got == expected, (promql, got, expected)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.mark.kernel
@pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus package is not installed "
                    "(apt-get install -y prometheus; .ci/run installs it)")
def test_prometheus_sees_the_exact_counts(tmp_path, prog, lib):
    before = Held(prog, BEFORE)
    monitor = server = None
    try:
        # Every return taken: the one failed launch's error is exact too (by default launch
        # returns are sampled where the kernel has uprobe sessions: test_sampled_returns.py,
        # test_monitor.py check that mode's counts).
        monitor = MonitorCli("-p", lib, "--prometheus", "127.0.0.1:0", "--return-sampling", "1")
        server = Prometheus(tmp_path, monitor.metrics_port)
        server.wait_for('up{job="ebpf-cuda"}', 1)
        before.go()
        after = Held(prog, AFTER).go()
        before.wait()
        after.wait()
        # Every family the issue asks for that the in-kernel counts support:
        server.wait_for('sum(ebpf_cuda_api_calls_total{api="cudaMalloc"})', 51)
        assert server.number('ebpf_cuda_api_calls_total{api="cudaSetDevice",'
                             'layer="runtime"}') == 3
        assert server.number('sum(ebpf_cuda_api_calls_total{api="cudaLaunchKernel"})') == 9
        assert server.number('sum(ebpf_cuda_api_errors_total)') == 3
        assert server.number('ebpf_cuda_api_errors_total{api="cudaMalloc",'
                             'error="cudaErrorMemoryAllocation"}') == 1
        assert server.number('ebpf_cuda_api_errors_total{api="cudaLaunchKernel",'
                             'error="cudaErrorInvalidConfiguration"}') == 1
        assert server.number('ebpf_cuda_memcpy_bytes_total{kind="HostToDevice"}') == 2000
        assert server.number('ebpf_cuda_memcpy_bytes_total{kind="DeviceToHost"}') == 300
        assert server.number('ebpf_cuda_memcpy_bytes_total{kind="DeviceToDevice"}') == 50
        assert server.number('ebpf_cuda_memset_bytes_total') == 64
        assert server.number('ebpf_cuda_alloc_bytes_total{api="cudaMalloc"}') == 40 * 4096 + 1000
        assert server.number('ebpf_cuda_api_duration_seconds_count{api="cudaMalloc"}') == 51
        assert server.number('ebpf_cuda_api_duration_seconds_bucket{api="cudaMalloc",'
                             'le="+Inf"}') == 51
        p99 = server.number('histogram_quantile(0.99, ebpf_cuda_api_duration_seconds_bucket'
                            '{api="cudaMalloc"})')
        assert 0 < p99 < 1
        assert server.number('sum(ebpf_cuda_events_lost_total)') == 0
        # Launches by process and kernel; the processes have exited: their last values
        # were scraped, then their series went (stale), while the totals stay.
        for held, launches in ((before, 5), (after, 3)):
            series = 'ebpf_cuda_kernel_launches_total{pid="%d",kernel="%s"}' % (held.pid, KERNEL)
            server.wait_for("max_over_time(%s[5m])" % series, launches)
            server.wait_for(series, None)
        # Calls and errors by process: the same processes' own counts, then stale too.
        for held, mallocs, errors in ((before, 40, 0), (after, 11, 1)):
            mine = '{pid="%d",api="cudaMalloc"}' % held.pid
            server.wait_for("max_over_time(ebpf_cuda_process_api_calls_total%s[5m])" % mine,
                            mallocs)
            server.wait_for("max_over_time(ebpf_cuda_process_api_errors_total%s[5m])" % mine,
                            errors)
            server.wait_for("ebpf_cuda_process_api_calls_total%s" % mine, None)
        server.wait_for('ebpf_cuda_processes', 0)
        assert server.number('sum(ebpf_cuda_api_calls_total{api="cudaMalloc"})') == 51
    finally:
        before.kill()
        if server is not None:
            server.close()
        if monitor is not None:
            assert monitor.stop(signal.SIGTERM) == 0, monitor.lines


# -- the exposition format ------------------------------------------------------------------

def test_the_page_follows_the_text_format():
    families = [
        Family("x_calls", "counter", "Calls.\nTwo lines \\ here.", "1",
               [((("api", "cudaMalloc"), ("comm", 'we"ird\\\n')), 3)]),
        Family("x_live", "gauge", "Live.", "1", [((), 2.5)]),
        Family("x_seconds", "histogram", "Durations.", "s",
               [((("api", "a"),), histogram([0] * 9 + [2] + [0] * 30, 1024, 2))]),
        Family("y_seconds", "histogram", "Unlabelled.", "s",
               [((), histogram([0] * 10 + [1] + [0] * 29, 2048, 1))]),
    ]
    page = prometheus.render(families).decode()
    lines = page.splitlines()
    assert lines[:3] == ["# HELP x_calls_total Calls.\\nTwo lines \\\\ here.",
                         "# TYPE x_calls_total counter",
                         'x_calls_total{api="cudaMalloc",comm="we\\"ird\\\\\\n"} 3']
    assert "# TYPE x_live gauge" in lines and "x_live 2.5" in lines
    assert 'x_seconds_bucket{api="a",le="5.12e-07"} 0' in lines
    assert 'x_seconds_bucket{api="a",le="1.024e-06"} 2' in lines
    assert 'x_seconds_bucket{api="a",le="+Inf"} 2' in lines
    assert 'x_seconds_sum{api="a"} 1.024e-06' in lines
    assert 'x_seconds_count{api="a"} 2' in lines
    assert 'y_seconds_bucket{le="1.024e-06"} 0' in lines
    assert 'y_seconds_bucket{le="2.048e-06"} 1' in lines
    assert 'y_seconds_bucket{le="+Inf"} 1' in lines
    assert "y_seconds_sum 2.048e-06" in lines and "y_seconds_count 1" in lines
    assert page.endswith("\n")


@pytest.mark.parametrize("text, address", [
    ("127.0.0.1:9464", ("127.0.0.1", 9464)), (":9000", ("127.0.0.1", 9000)),
    ("9100", ("127.0.0.1", 9100)), ("0.0.0.0:80", ("0.0.0.0", 80)),
    ("[::1]:9464", ("::1", 9464)),
])
def test_addresses(text, address):
    assert prometheus.parse_address(text) == address


# -- the server -----------------------------------------------------------------------------

def _exchange(port: int, request: bytes, family=socket.AF_INET, host="127.0.0.1") -> bytes:
    """What the server answers `request` with, to the end (it closes the connection)."""
    with socket.socket(family) as s:
        s.settimeout(10)
        s.connect((host, port))
        s.sendall(request)
        answer = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return answer
            answer += chunk


@pytest.fixture
def server():
    families = [Family("x_calls", "counter", "Calls.", "1", [((("api", "a"),), 7)])]
    server = prometheus.MetricsServer(("127.0.0.1", 0), lambda: families).start()
    yield server
    server.close()


def test_the_server_answers_get_and_head_of_metrics(server):
    port = server.address[1]
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics?x=1" % port, timeout=10) as got:
        assert got.status == 200
        assert got.headers["Content-Type"] == prometheus.CONTENT_TYPE
        body = got.read()
    assert body == b'# HELP x_calls_total Calls.\n# TYPE x_calls_total counter\n' \
                   b'x_calls_total{api="a"} 7\n'
    head = _exchange(port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Length: %d\r\n" % len(body) in head and head.endswith(b"\r\n\r\n")


@pytest.mark.parametrize("request_bytes, status", [
    (b"GET / HTTP/1.1\r\n\r\n", b"404 Not Found"),
    (b"GET /metricsx HTTP/1.0\r\n\r\n", b"404 Not Found"),
    (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"405 Method Not Allowed"),
    (b"hello\r\n\r\n", b"400 Bad Request"),
    (b"GET /metrics SPDY/3\r\n\r\n", b"400 Bad Request"),
    (b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n", b"400 Bad Request"),
])
def test_the_server_refuses_what_it_does_not_serve(server, request_bytes, status):
    answer = _exchange(server.address[1], request_bytes)
    assert answer.startswith(b"HTTP/1.1 " + status + b"\r\n"), answer[:200]
    assert b"Connection: close\r\n" in answer


def test_a_client_that_sends_nothing_does_not_stop_the_others(server):
    port = server.address[1]
    with socket.create_connection(("127.0.0.1", port)) as idle:
        idle.sendall(b"GET /met")  # (and nothing more)
        answer = _exchange(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")


def test_idle_clients_hold_max_clients_threads_at_most(monkeypatch):
    """Past MAX_CLIENTS connections being served, another is closed at once (no thread
    waits on it); once they go, scrapes are answered again."""
    monkeypatch.setattr(prometheus, "MAX_CLIENTS", 4)
    server = prometheus.MetricsServer(("127.0.0.1", 0), lambda: []).start()
    port = server.address[1]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    try:
        for s in idle:
            s.sendall(b"GET /met")  # (and nothing more: each holds a thread)
        time.sleep(0.3)
        threads = threading.active_count()
        try:
            refused = _exchange(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        except ConnectionResetError:  # (closed with the request unread)
            refused = b""
        assert refused == b""  # (closed at once, unanswered)
        assert server._server.turned_away == 1 and threading.active_count() == threads
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 10
    while True:  # (their threads see the close and end)
        answer = _exchange(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        if answer or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    server.close()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")


def test_a_failing_collect_is_a_500_and_the_server_goes_on():
    calls = []

    def collect():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return []
    server = prometheus.MetricsServer(("127.0.0.1", 0), collect).start()
    try:
        port = server.address[1]
        first = _exchange(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert first.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
        assert first.endswith(b"cannot collect: boom\n")
        assert _exchange(port, b"GET /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200 OK")
    finally:
        server.close()


def test_the_server_listens_on_ipv6_loopback():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        server = prometheus.MetricsServer(("::1", 0), lambda: []).start()
    except Exception as err:  # (a machine without ::1)
        pytest.skip("cannot listen on ::1: %s" % err)
    try:
        answer = _exchange(server.address[1], b"GET /metrics HTTP/1.1\r\n\r\n",
                           socket.AF_INET6, "::1")
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    finally:
        server.close()


def test_serving_metrics_costs_no_ssl_or_http_client():
    """An always-on monitor's memory: importing the server brings neither `ssl` (~4 MB
    resident) nor `http.client`/`http.server` (~2 MB)."""
    code = ("import sys, ebpf_cuda.monitor.prometheus; "
            "print(sorted(m for m in ('ssl', 'http.client', 'http.server') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.PIPE,
                         text=True).stdout
    assert out.strip() == "[]"


def test_an_unforeseen_failure_is_one_line_and_the_server_goes_on(capfd):
    class Odd:  # (a collect whose families cannot even be rendered into the error text)
        def __str__(self):
            raise ValueError("no words")

    def collect():
        raise RuntimeError(Odd())  # (its message fails inside the handler's own except)
    server = prometheus.MetricsServer(("127.0.0.1", 0), collect).start()
    try:
        port = server.address[1]
        assert _exchange(port, b"GET /metrics HTTP/1.1\r\n\r\n") == b""  # (closed, nothing)
        assert _exchange(port, b"GET / HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404")
    finally:
        server.close()
    err = capfd.readouterr().err
    assert "a /metrics request from 127.0.0.1 failed" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
