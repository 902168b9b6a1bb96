"""The OTLP pusher against collectors that fail: a server that speaks no HTTP, a refused
connection. Each failure is counted and said once per reason; the pushing goes on, and
stopping is clean."""
import socket
import threading

from ebpf_cuda.monitor.otlp import OtlpPusher


class NotHttp:
    """Accepts connections on a loopback port and answers each with an SSH banner."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(8)
        self.connections = 0
        self.url = "http://127.0.0.1:%d" % self.socket.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.recv(65536)
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

    def close(self) -> None:
        self.socket.close()


def test_a_collector_that_speaks_no_http_is_a_failure_said_once():
    server, said = NotHttp(), []
    pusher = OtlpPusher(server.url, 60.0, lambda: [], 0.0, on_error=said.append)
    try:
        assert [pusher.push() for _ in range(3)] == [False] * 3
    finally:
        server.close()
    assert (pusher.pushes, pusher.failures, server.connections) == (0, 3, 3)
    assert len(said) == 1 and said[0].startswith(
        "cannot push metrics to %s/v1/metrics: " % server.url)


def test_a_refused_connection_is_a_failure_and_close_still_pushes_once():
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    url = "http://127.0.0.1:%d" % free.getsockname()[1]
    free.close()  # (nothing listens there now)
    said, collects = [], []
    pusher = OtlpPusher(url, 0.05, lambda: collects.append(1) or [], 0.0, on_error=said.append)
    pusher.start()
    threading.Event().wait(0.3)
    pusher.close()  # (no exception: the last push fails like the others)
    assert pusher.pushes == 0 and pusher.failures == len(collects) >= 2
    assert len(said) == 1 and "Connection refused" in said[0]
