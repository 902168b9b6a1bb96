"""What the monitor's tests share: stand-in processes held until told to go, the monitor in
this process or as `ebpf-cuda monitor`, and /metrics pages read back.

- `Held(prog, ops)`: the driver program started now, waiting on its stdin until `go()`;
- `running_monitor(**options)`: a Monitor reading in a thread of this process;
- `MonitorCli(*args)`: `ebpf-cuda monitor ARGS`, its stderr lines collected by a thread;
- `parse_metrics(text)`, `value(samples, name, **labels)`: a Prometheus page's samples;
- BEFORE and AFTER: the calls of a process started before the monitor and of one after.
"""
import re
import subprocess
import threading
import time
from contextlib import contextmanager
from typing import Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple

from fakecuda import Call, parse_output
from helpers import cli_argv, cli_env, REPO

# Started before the monitor (held until it runs) and after it. The first call sends the
# thread's hello record; the pause after it lets the reader read the process's mappings
# (kernel names by address) while it lives.
BEFORE = ["setdevice:0", "sleep:300", "loop:40:malloc:4096", "memcpy:1000:1", "memcpy:1000:1",
          "memcpy:300:2", "memset:0:64", "setdevice:9", "loop:5:launch:4,1,1:256,1,1",
          "sleep:100"]
AFTER = ["setdevice:1", "sleep:300", "loop:10:malloc:100", "malloc:0x20000000000",
         "memcpy:50:3", "loop:3:launch:2,1,1:32,1,1", "launch:1,1,1:2000,1,1", "sleep:100"]
KERNEL = "vec_add_kernel"


class Held:
    """The driver program with `ops`, started now and held (--wait-stdin) until `go()`."""

    def __init__(self, prog, ops: Sequence[str], prefix: Sequence[str] = (),
                 env: Optional[dict] = None) -> None:
        self.proc = subprocess.Popen([*prefix, str(prog), "--wait-stdin", *ops],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env)
        line = self.proc.stdout.readline()
        match = re.match(r"ready pid=(\d+)", line)
        assert match, "the program did not start: %r" % line
        self.pid = int(match.group(1))

    def go(self) -> "Held":
        self.proc.stdin.write("\n")
        self.proc.stdin.close()
        self.proc.stdin = None  # (communicate() would flush it)
        return self

    def wait(self, timeout: float = 30) -> List[Call]:
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, self.proc.returncode
        return parse_output(out)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def running_monitor(**options) -> Iterator:
    """A started Monitor whose reader runs in a thread; stopped and closed at the end."""
    from ebpf_cuda.monitor.agent import Monitor, MonitorOptions

    monitor = Monitor(MonitorOptions(**options))
    monitor.add_exporter("")  # (the tests collect as one, from the start)
    monitor.start()
    thread = threading.Thread(target=monitor.run, daemon=True)
    thread.start()
    try:
        yield monitor
    finally:
        monitor.stop()
        thread.join(10)
        monitor.close()


def settle(monitor, ticks: int = 3, timeout: float = 300) -> None:
    """Let the reader publish what the kernel has counted: `ticks` series published from
    now on (the first may have begun before the last call; the second began after it; a
    launch whose name was not known when that one first saw it waits for the third). A
    tick takes ~TICK_S on a real machine, but naming a full launches map takes seconds
    under emulation (the kernel matrix's guests): a fixed sleep read a series made before."""
    from ebpf_cuda.monitor.agent import TICK_S

    deadline = time.monotonic() + timeout
    for _ in range(ticks):
        before = monitor._series
        while monitor._series is before:
            if time.monotonic() > deadline:
                raise AssertionError("the monitor published no series in %d s" % timeout)
            time.sleep(TICK_S / 10)


class MonitorCli:
    """`ebpf-cuda monitor ARGS` as a subprocess; `lines` are its stderr lines so far."""

    def __init__(self, *args, ready: str = "monitoring ", timeout: float = 60,
                 prefix: Sequence[str] = (), env: Optional[dict] = None) -> None:
        self.proc = subprocess.Popen([*prefix, *cli_argv("monitor", *args)],
                                     stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env or cli_env(), cwd=str(REPO))
        self.lines: List[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.wait_for(ready, timeout)

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = 30) -> str:
        """The first stderr line holding `text` (waiting for it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if text in line:
                    return line
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError("no %r from the monitor: %s" % (text, "\n".join(self.lines)))

    @property
    def metrics_port(self) -> int:
        line = self.wait_for("metrics at http://")
        return int(re.search(r":(\d+)/metrics", line).group(1))

    def stop(self, signum: int = 15, timeout: float = 30) -> int:
        """Send `signum`; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        self.proc.stdout.close()
        return self.proc.returncode


Samples = Dict[Tuple[str, FrozenSet[Tuple[str, str]]], float]
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> Samples:
    """The samples of a Prometheus text page: (name, labels) → value."""
    samples: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, "not a sample line: %r" % line
        labels = frozenset((k, v.replace('\\"', '"').replace("\\n", "\n")
                            .replace("\\\\", "\\")) for k, v in _LABEL.findall(match[2] or ""))
        samples[(match[1], labels)] = float(match[3])
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and want <= have)


def scrape(port: int) -> Tuple[str, str]:
    """(content type, page) of http://127.0.0.1:PORT/metrics."""
    import urllib.request

    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as answer:
        return answer.headers["Content-Type"], answer.read().decode()
