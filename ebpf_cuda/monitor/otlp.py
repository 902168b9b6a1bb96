"""`--otlp URL`: the monitor's metrics pushed as OTLP/HTTP JSON (stdlib urllib, no SDK).

    pusher = OtlpPusher("http://collector:4318", 15, monitor.collect, monitor.started_at)
    pusher.start()   # a daemon thread: one POST every interval, one more at close()
    pusher.close()

`request(families, ...)` is one ExportMetricsServiceRequest in the JSON mapping of
opentelemetry-proto (opentelemetry/proto/collector/metrics/v1): counters are cumulative
monotonic sums, gauges gauges, histograms explicit-bucket histograms (per-bucket counts, one
more than the bounds). 64-bit integers are strings, as the protobuf JSON mapping writes them.
"""
import http.client
import json
import os
import threading
import time
import urllib.request
from typing import Callable, List, Optional, Sequence

from .metrics import Family, Histogram, Labels

CUMULATIVE = 2  # AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
METRICS_PATH = "/v1/metrics"
TIMEOUT_S = 10.0


def metrics_url(url: str) -> str:
    """The collector's URL with /v1/metrics when it has no path of its own."""
    from urllib.parse import urlsplit

    from ..errors import UsageError

    try:
        parts = urlsplit(url)
        parts.port  # (ValueError: a port that is no number, or out of range)
    except ValueError as err:
        raise UsageError("--otlp: %r is no URL: %s" % (url, err)) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError("--otlp takes an http:// or https:// URL, not %r" % url)
    return url if parts.path not in ("", "/") else url.rstrip("/") + METRICS_PATH


def request(families: Sequence[Family], start_ns: int, now_ns: int) -> dict:
    """The ExportMetricsServiceRequest of `families` (a JSON object)."""
    metrics = [m for m in (_metric(f, start_ns, now_ns) for f in families) if m is not None]
    resource = {"attributes": [_attribute("service.name", "ebpf-cuda"),
                               _attribute("host.name", os.uname().nodename)]}
    return {"resourceMetrics": [{"resource": resource, "scopeMetrics": [
        {"scope": {"name": "ebpf-cuda"}, "metrics": metrics}]}]}


def _metric(family: Family, start_ns: int, now_ns: int) -> Optional[dict]:
    if not family.samples:
        return None
    times = {"startTimeUnixNano": str(start_ns), "timeUnixNano": str(now_ns)}
    out = {"name": family.name, "description": family.help, "unit": family.unit}
    if family.kind == "histogram":
        out["histogram"] = {"aggregationTemporality": CUMULATIVE, "dataPoints": [
            dict(_histogram_point(value), attributes=_attributes(labels), **times)
            for labels, value in family.samples]}
    else:
        points = [dict(_number(value), attributes=_attributes(labels), **times)
                  for labels, value in family.samples]
        if family.kind == "counter":
            out["sum"] = {"aggregationTemporality": CUMULATIVE, "isMonotonic": True,
                          "dataPoints": points}
        else:
            out["gauge"] = {"dataPoints": points}
    return out


def _histogram_point(h: Histogram) -> dict:
    counts = [b - a for a, b in zip((0,) + h.cumulative, h.cumulative + (h.count,))]
    return {"count": str(h.count), "sum": h.sum, "bucketCounts": [str(n) for n in counts],
            "explicitBounds": list(h.bounds)}


def _number(value) -> dict:
    return {"asInt": str(value)} if isinstance(value, int) else {"asDouble": float(value)}


def _attribute(key: str, value: str) -> dict:
    return {"key": key, "value": {"stringValue": value}}


def _attributes(labels: Labels) -> List[dict]:
    return [_attribute(key, value) for key, value in labels]


class OtlpPusher:
    """POSTs `request(collect())` to `url` every `interval` seconds from a daemon thread,
    and once more at `close()`. A failed push is said once per distinct reason (through
    `on_error`) and counted (`failures`); the next one tries again."""

    def __init__(self, url: str, interval: float, collect: Callable[[], Sequence[Family]],
                 started_at: float, on_error: Optional[Callable[[str], None]] = None) -> None:
        self.url = metrics_url(url)
        self.interval = interval
        self.collect = collect
        self.start_ns = int(started_at * 1e9)
        self.on_error = on_error or (lambda message: None)
        self.pushes = 0
        self.failures = 0
        self._said: set = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ebpf-cuda otlp", daemon=True)

    def start(self) -> "OtlpPusher":
        self._thread.start()
        return self

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            self.push()

    def push(self) -> bool:
        """One export now; False when it failed."""
        body = json.dumps(request(self.collect(), self.start_ns, time.time_ns())).encode()
        post = urllib.request.Request(self.url, data=body, method="POST",
                                      headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(post, timeout=TIMEOUT_S) as answer:
                answer.read()
        except (OSError, http.client.HTTPException, ValueError) as err:
            # (URLError and HTTPError are OSErrors; a server that is no HTTP server gives
            # an HTTPException such as BadStatusLine)
            self.failures += 1
            reason = str(getattr(err, "reason", err))
            if reason not in self._said:
                self._said.add(reason)
                self.on_error("cannot push metrics to %s: %s" % (self.url, reason))
            return False
        self.pushes += 1
        return True

    def close(self) -> None:
        """Stop the thread, then push the last values (when it was started)."""
        if not self.started:
            return
        self._done.set()
        self._thread.join()
        self.push()
