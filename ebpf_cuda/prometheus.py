"""`/metrics` in the Prometheus text exposition format 0.0.4, served by `http.server`.

    server = MetricsServer(("127.0.0.1", 9464), monitor.collect)
    server.start()      # a daemon thread; server.address is where it listens
    ...
    server.close()

`render(families)` is the page: `# HELP`, `# TYPE`, then one line per sample; counters get
the `_total` suffix, histograms their `_bucket{le=...}`, `_sum` and `_count` lines.
Everything on the page can be read by whoever reaches the address (process names, PIDs,
container ids, kernel names): it listens on the loopback interface unless told otherwise.
"""
import http.server
import socket
import threading
from typing import Callable, List, Sequence, Tuple

from .errors import UsageError
from .monitor import Family, Histogram, Labels

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464  # (the port OpenTelemetry's Prometheus exporter uses by default)


def parse_address(text: str) -> Tuple[str, int]:
    """`HOST:PORT`, `[IPv6]:PORT`, `:PORT` or `PORT` → (host, port); host defaults to the
    loopback address. UsageError for anything else."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or DEFAULT_HOST
    if not port.isdigit() or int(port) > 65535:
        raise UsageError("--prometheus takes HOST:PORT (e.g. 127.0.0.1:9464), not %r" % text)
    return host, int(port)


def render(families: Sequence[Family]) -> bytes:
    """The exposition text of `families`."""
    out: List[str] = []
    for family in families:
        name = family.name + ("_total" if family.kind == "counter" else "")
        kind = "histogram" if family.kind == "histogram" else family.kind
        out.append("# HELP %s %s\n# TYPE %s %s\n" % (name, _help(family.help), name, kind))
        for labels, value in family.samples:
            if isinstance(value, Histogram):
                out += _histogram_lines(name, labels, value)
            else:
                out.append("%s%s %s\n" % (name, _labels(labels), _number(value)))
    return "".join(out).encode("utf-8")


def _histogram_lines(name: str, labels: Labels, h: Histogram) -> List[str]:
    lines = ["%s_bucket%s %d\n" % (name, _labels(labels + (("le", _number(bound)),)), n)
             for bound, n in zip(h.bounds, h.cumulative)]
    lines.append("%s_bucket%s %d\n" % (name, _labels(labels + (("le", "+Inf"),)), h.count))
    lines.append("%s_sum%s %s\n" % (name, _labels(labels), _number(h.sum)))
    lines.append("%s_count%s %d\n" % (name, _labels(labels), h.count))
    return lines


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{%s}" % ",".join('%s="%s"' % (key, _escape(value)) for key, value in labels)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value) -> str:
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


class MetricsServer:
    """Serves `render(collect())` at /metrics from a daemon thread."""

    def __init__(self, address: Tuple[str, int],
                 collect: Callable[[], Sequence[Family]]) -> None:
        handler = _handler(collect)
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        server_class = type("Server", (http.server.ThreadingHTTPServer,),
                            {"address_family": family, "daemon_threads": True})
        try:
            self._server = server_class(address, handler)
        except OSError as err:
            raise UsageError("cannot listen on %s:%d: %s"
                             % (address[0], address[1], err.strerror or err)) from None
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.2,),
                                        name="ebpf-cuda metrics", daemon=True)

    @property
    def address(self) -> Tuple[str, int]:
        """(host, port) it listens on (the port chosen when 0 was asked for)."""
        host, port = self._server.server_address[:2]
        return host, port

    def start(self) -> "MetricsServer":
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()


def _handler(collect: Callable[[], Sequence[Family]]):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "only /metrics is here")
                return
            body = render(collect())
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # no access log on stderr
            pass

    return Handler
