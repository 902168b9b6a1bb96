"""`ebpf-cuda monitor --otlp URL`: the pushes a small local HTTP server receives are valid
OTLP/HTTP JSON (parsed by opentelemetry-proto's generated classes through
google.protobuf.json_format) and carry the exact counts of a stand-in's calls."""
import http.server
import json
import signal
import threading
import time

import pytest

from monitor_support import Held, MonitorCli

metrics_service = pytest.importorskip(
    "opentelemetry.proto.collector.metrics.v1.metrics_service_pb2",
    reason="opentelemetry-proto is not installed (pip install -e '.[test]')")
json_format = pytest.importorskip("google.protobuf.json_format")


class Collector:
    """Takes POSTs to /v1/metrics on a loopback port; `bodies` are what came."""

    def __init__(self) -> None:
        self.bodies = []
        self.paths = []
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                data = self.rfile.read(int(self.headers["Content-Length"]))
                collector.paths.append((self.path, self.headers["Content-Type"]))
                collector.bodies.append(data)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def points(body: bytes, name: str) -> dict:
    """{attributes as a frozenset: data point} of metric `name` in a parsed push."""
    request = json_format.Parse(body.decode(), metrics_service.ExportMetricsServiceRequest())
    found = {}
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name:
                    continue
                data = getattr(metric, metric.WhichOneof("data"))
                for point in data.data_points:
                    key = frozenset((a.key, a.value.string_value) for a in point.attributes)
                    found[key] = point
    return found


@pytest.mark.kernel
def test_pushes_are_valid_otlp_with_the_counts(prog, lib):
    collector = Collector()
    cli = None
    try:
        cli = MonitorCli("-p", lib, "--otlp", collector.url, "--interval", "0.5")
        Held(prog, ["setdevice:0", "sleep:300", "loop:12:malloc:64", "memcpy:100:1",
                    "setdevice:9", "loop:2:launch:4,1,1:256,1,1"]).go().wait()
        time.sleep(1.5)
        assert cli.stop(signal.SIGTERM) == 0, cli.lines  # (a last push at the end)
    finally:
        collector.close()
    assert collector.paths[0] == ("/v1/metrics", "application/json")
    last = collector.bodies[-1]
    calls = points(last, "ebpf_cuda_api_calls")
    assert calls[frozenset({("api", "cudaMalloc"), ("layer", "runtime")})].as_int == 12
    errors = points(last, "ebpf_cuda_api_errors")
    assert errors[frozenset({("api", "cudaSetDevice"), ("layer", "runtime"),
                             ("error", "cudaErrorInvalidDevice")})].as_int == 1
    copies = points(last, "ebpf_cuda_memcpy_bytes")
    assert sum(p.as_int for p in copies.values()) == 100
    durations = points(last, "ebpf_cuda_api_duration_seconds")
    malloc = durations[frozenset({("api", "cudaMalloc"), ("layer", "runtime")})]
    assert malloc.count == 12 and sum(malloc.bucket_counts) == 12
    assert len(malloc.bucket_counts) == len(malloc.explicit_bounds) + 1
    # per process: pushed while it ran and once after it exited, then no more
    launches = [sum(p.as_int for p in points(body, "ebpf_cuda_kernel_launches").values())
                for body in collector.bodies]
    assert max(launches) == 2 and launches[-1] == 0
    request = json.loads(last)
    metric = request["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]
    assert metric["sum"]["aggregationTemporality"] == 2 and metric["sum"]["isMonotonic"]
