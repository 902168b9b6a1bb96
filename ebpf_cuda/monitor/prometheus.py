"""`/metrics` in the Prometheus text exposition format 0.0.4, served over HTTP/1.1.

    server = MetricsServer(("127.0.0.1", 9464), monitor.collect)
    server.start()      # a daemon thread; server.address is where it listens
    ...
    server.close()

`render(families)` is the page: `# HELP`, `# TYPE`, then one line per sample; counters get
the `_total` suffix, histograms their `_bucket{le=...}`, `_sum` and `_count` lines.
Everything on the page can be read by whoever reaches the address (process names, PIDs,
container ids, kernel names): it listens on the loopback interface unless told otherwise.

The server is `socketserver` with a request handler of a few lines, not `http.server`:
that one imports `http.client`, which imports `ssl`, and the two cost an always-on monitor
~6 MB of its resident memory (a tenth of its budget) for nothing it serves.
"""
import functools
import socket
import socketserver
import sys
import threading
from typing import Callable, Dict, List, Sequence, Tuple

from ..errors import UsageError
from .metrics import Family, Histogram, Labels

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464  # (the port OpenTelemetry's Prometheus exporter uses by default)


def parse_address(text: str) -> Tuple[str, int]:
    """`HOST:PORT`, `[IPv6]:PORT`, `:PORT` or `PORT` → (host, port); host defaults to the
    loopback address. UsageError for anything else."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or DEFAULT_HOST
    if not (port.isascii() and port.isdigit()) or int(port) > 65535:  # (not "²")
        raise UsageError("--prometheus takes HOST:PORT (e.g. 127.0.0.1:9464), not %r" % text)
    return host, int(port)


def render(families: Sequence[Family]) -> bytes:
    """The exposition text of `families`."""
    out: List[str] = []
    # Labels escaped once a page: the series by process have the same labels in three
    # families, those by function in two.
    bodies: Dict[Labels, str] = {}
    for family in families:
        name = family.name + ("_total" if family.kind == "counter" else "")
        kind = "histogram" if family.kind == "histogram" else family.kind
        out.append("# HELP %s %s\n# TYPE %s %s\n" % (name, _help(family.help), name, kind))
        for labels, value in family.samples:
            body = bodies.get(labels)
            if body is None:
                body = bodies[labels] = _label_body(labels)
            if isinstance(value, Histogram):
                out += _histogram_lines(name, body, value)
            else:
                out.append("%s%s %s\n" % (name, _braced(body), _number(value)))
    return "".join(out).encode("utf-8")


def _histogram_lines(name: str, body: str, h: Histogram) -> List[str]:
    """The lines of one histogram whose labels are `body` (rendered once: ~30 buckets)."""
    before_le = "%s_bucket{%s%s" % (name, body, "," if body else "")
    lines = ['%sle="%s"} %d\n' % (before_le, bound, n)
             for bound, n in zip(_bound_texts(h.bounds), h.cumulative)]
    lines.append('%sle="+Inf"} %d\n' % (before_le, h.count))
    lines.append("%s_sum%s %s\n" % (name, _braced(body), _number(h.sum)))
    lines.append("%s_count%s %d\n" % (name, _braced(body), h.count))
    return lines


def _braced(body: str) -> str:
    return "{%s}" % body if body else ""


@functools.lru_cache(maxsize=8)
def _bound_texts(bounds: Tuple[float, ...]) -> Tuple[str, ...]:
    """The `le` values of `bounds` (the histograms of a page share one tuple of bounds)."""
    return tuple(_number(bound) for bound in bounds)


def _label_body(labels: Labels) -> str:
    return ",".join(['%s="%s"' % (key, _escape(value)) for key, value in labels])


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
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        try:
            self._server = _Server(address, family, collect)
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


MAX_CLIENTS = 64  # connections served at once: a thread each, waiting READ_TIMEOUT_S at most


class _Server(socketserver.ThreadingTCPServer):
    """A thread per connection, MAX_CLIENTS at most: clients that connect and send nothing
    cannot make the monitor hold a thread each (and its memory) without bound; a connection
    past the bound is closed at once (a scraper tries again at its next scrape)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: Tuple[str, int], family: int,
                 collect: Callable[[], Sequence[Family]]) -> None:
        self.address_family = family
        self.collect = collect
        self.turned_away = 0  # connections closed at once: MAX_CLIENTS were being served
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)
        super().__init__(address, _Handler)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.turned_away += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # (no thread started: its slot is free again)
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address) -> None:
        """A request that failed in a way the handler did not foresee: one line on stderr,
        not socketserver's traceback; the server goes on."""
        error = sys.exc_info()[1]
        sys.stderr.write("ebpf-cuda: a /metrics request from %s failed: %s\n"
                         % (client_address[0], error))


MAX_LINE = 8192  # bytes of a request line or header line
MAX_HEADERS = 100
READ_TIMEOUT_S = 10.0  # a client that stops sending mid-request is dropped after this
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           500: "Internal Server Error"}


class _Handler(socketserver.StreamRequestHandler):
    """One request a connection: GET or HEAD of /metrics (a query string is ignored); 404
    for other paths, 405 for other methods, 400 for what is not an HTTP request. The
    answer says `Connection: close` (a scraper connects again for the next scrape)."""

    timeout = READ_TIMEOUT_S

    def handle(self) -> None:
        try:
            request = self._read_request()
        except OSError:  # (a timeout, a reset: the client is gone)
            return
        if request is None:
            self._answer(400, b"not an HTTP request\n")
            return
        method, target = request
        if method not in (b"GET", b"HEAD"):
            self._answer(405, b"only GET and HEAD\n", extra="Allow: GET, HEAD\r\n")
        elif target.split(b"?", 1)[0] != b"/metrics":
            self._answer(404, b"only /metrics is here\n")
        else:
            try:
                body = render(self.server.collect())  # type: ignore[attr-defined]
            except Exception as err:  # (a bug of ours: said to the client, the monitor goes on)
                self._answer(500, ("cannot collect: %s\n" % err).encode("utf-8", "replace"))
                return
            self._answer(200, body, CONTENT_TYPE, head=method == b"HEAD")

    def _read_request(self):
        """(method, target) of the request line, its headers read and ignored; None when
        it is not an HTTP request."""
        parts = self.rfile.readline(MAX_LINE + 1).split()
        for _ in range(MAX_HEADERS):
            line = self.rfile.readline(MAX_LINE + 1)
            if line in (b"\r\n", b"\n", b""):
                break
        else:
            return None
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return None
        return parts[0], parts[1]

    def _answer(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
                head: bool = False, extra: str = "") -> None:
        header = ("HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s"
                  "Connection: close\r\n\r\n" % (status, REASONS[status], content_type,
                                                   len(body), extra))
        try:
            self.wfile.write(header.encode("ascii") + (b"" if head else body))
        except OSError:
            pass  # (the client went away)
