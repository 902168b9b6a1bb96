"""`ebpf-cuda monitor`: count the CUDA calls of every process of this machine until stopped,
for Prometheus, an OTLP collector, a pprof profile and the flight recorder (monitor/); its
stop signals are `signals.MonitorSignals`'."""
import functools
import os
import sys
from typing import List, Optional, Tuple

import click

from ..errors import UsageError
from ..monitor import heap
from ..output import plan
from .common import say, split_functions
from .signals import MonitorSignals


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="Say which files and offsets are probed.")
@click.option("-p", "--path", "paths", multiple=True, metavar="PATH",
              help="Library or executable to probe (repeatable). Default: every CUDA runtime "
                   "and driver file found, and those running processes map.")
@click.option("--functions", metavar="NAME,...", help="Functions to count (default set).")
@click.option("--all", "everything", is_flag=True, help="Every function of the table.")
@click.option("--api", type=click.Choice(["runtime", "driver", "all"]), default="all",
              show_default=True, help="Which layer to count.")
@click.option("--prometheus", metavar="HOST:PORT",
              help="Serve /metrics (Prometheus text format) there; HOST defaults to "
                   "127.0.0.1. Anyone who can reach it reads process and kernel names.")
@click.option("--kernel-labels", type=click.IntRange(min=0),
              default=20,  # (monitor/agent.DEFAULT_KERNEL_LABELS)
              show_default=True,
              help="Kernel names per process given a label of their own (the first ones "
                   "it launches); the rest count as kernel=\"other\". 0: none.")
@click.option("--otlp", metavar="URL",
              help="Push the metrics as OTLP/HTTP JSON to URL (an OpenTelemetry collector's "
                   "http://HOST:4318; /v1/metrics is added when URL has no path).")
@click.option("--interval", type=float, default=15.0, show_default=True,
              metavar="SECONDS", help="How often --otlp pushes.")
@click.option("--pprof-out", metavar="FILE",
              help="At the end, write a pprof profile (gzipped profile.proto) of calls, API "
                   "time, launches, bytes allocated and copied, by function and kernel.")
@click.option("--flight-recorder", type=float, metavar="SECONDS",
              help="Keep every call of the last SECONDS on disk; write them as a saved "
                   "trace into --flight-dir when a trigger fires (every call then travels "
                   "the ring buffer: costlier than counting alone).")
@click.option("--flight-dir", default=".", show_default=True, metavar="DIR",
              help="Where the flight recorder keeps its ring and writes its dumps.")
@click.option("--flight-size", metavar="SIZE", default="1G", show_default=True,
              help="How much disk the flight recorder's ring may take.")
@click.option("--trigger-error", metavar="CODES", default="oom,illegal-address",
              show_default=True,
              help="Error returns that trigger a dump: families (oom, illegal-address), "
                   "numbers or names (cudaErrorLaunchFailure); none: no error triggers.")
@click.option("--trigger-latency", type=float, metavar="SECONDS",
              help="A synchronising call (cudaDeviceSynchronize, cuStreamSynchronize, ...) "
                   "at least this long triggers a dump.")
@click.option("--ring-size", metavar="SIZE",
              help="Ring buffer size (default 4M, 16M with --flight-recorder).")
@click.option("--return-sampling", type=click.IntRange(min=1), metavar="N",
              default=64,  # (monitor/agent.DEFAULT_SAMPLE_RETURNS)
              show_default=True,
              help="Kernel launches: take the return of 1 call in N (a power of two; "
                   "kernels with uprobe sessions, 6.13+): durations and errors of launches "
                   "are then sampled, their counts stay exact, and a launch costs no return "
                   "probe. 1: every return; at most 1048576.")
@click.option("--gpu/--no-gpu", "gpu", default=True, show_default=True,
              help="The GPU's state through NVML, as dcgm-exporter names it "
                   "(DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED, ...), with each process's GPU "
                   "memory and SM utilisation and the Xid errors (docs/monitor.md).")
@click.option("--gpu-samples", type=float, metavar="HZ", default=1.0, show_default=True,
              help="Sample the GPU's state HZ times a second, on a thread of its own (a "
                   "scrape serves the last sample, its age in "
                   "ebpf_cuda_gpu_sample_age_seconds); 0: off, as --no-gpu.")
@click.option("--nvml", "nvml_path", metavar="PATH",
              help="The libnvidia-ml.so.1 to read (default: as the loader finds it, then the "
                   "drivers' folders).")
@click.option("--trigger-xid/--no-trigger-xid", default=True, show_default=True,
              help="With --flight-recorder: an Xid error (NVML's event) triggers a dump.")
def monitor_cmd(verbose: int, paths: Tuple[str, ...], functions: Optional[str],
                everything: bool, api: str, prometheus: Optional[str], kernel_labels: int,
                otlp: Optional[str], interval: float, pprof_out: Optional[str],
                flight_recorder: Optional[float], flight_dir: str, flight_size: str,
                trigger_error: str, trigger_latency: Optional[float],
                ring_size: Optional[str], return_sampling: int, gpu: bool,
                gpu_samples: float, nvml_path: Optional[str], trigger_xid: bool) -> None:
    """Count the CUDA calls of every process of this machine until stopped (SIGINT,
    SIGTERM): ebpf-cuda monitor [--prometheus HOST:PORT] [--otlp URL] [...]"""
    signals = MonitorSignals()
    signals.install()  # first: a stop signal while starting unwinds what was set up
    from ..monitor.agent import Monitor, MonitorOptions
    from ..monitor.prometheus import parse_address

    address = parse_address(prometheus) if prometheus else None
    _positive_seconds(interval, "--interval")
    flight = _monitor_flight(flight_recorder, flight_dir, flight_size, trigger_error,
                             _positive_seconds(trigger_latency, "--trigger-latency"))
    _check_return_sampling(return_sampling)
    _check_gpu_samples(gpu_samples)
    options = MonitorOptions(tuple(paths), tuple(split_functions(functions) or ()) or None,
                             api, everything, kernel_labels,
                             plan.parse_size(ring_size) if ring_size else None, flight,
                             sample_returns=return_sampling, gpu=gpu and gpu_samples > 0,
                             nvml=nvml_path, trigger_xid=trigger_xid,
                             gpu_period_s=1.0 / gpu_samples if gpu_samples > 0 else 0.0)
    heap.for_long_runs()  # (an always-on process: large buffers unmapped when freed)
    monitor = signals.monitor = Monitor(options, log=say if verbose else None, notice=say)
    # What can fail does before the probes go on: the port is bound, the URL and the
    # profile's file checked.
    exporters = _monitor_exporters(monitor, address, otlp, interval)
    profile = plan.open_binary(pprof_out) if pprof_out else None
    written = True
    try:
        monitor.start()
        say("monitoring %d functions in %s" % (len(monitor.functions),
                                               ", ".join(monitor.files)))
        sampled = monitor.tracer.sampled_returns()
        if sampled:
            say("returns sampled, 1 call in %d (uprobe sessions): %s"
                % (return_sampling, " ".join(sampled)))
        for exporter, where in exporters:
            exporter.start()
            say(where)
        signals.running = True
        monitor.run()
        if profile is not None:
            written = _monitor_profile(monitor, profile, pprof_out)
    finally:
        signals.running = False
        for exporter, _ in exporters:
            exporter.close()
        monitor.close()
        if profile is not None:
            profile.close()
    say("stopped: %d processes seen%s" % (
        monitor.seen, "; %d flight-recorder dumps" % len(monitor.flight.paths)
        if monitor.flight is not None else ""))
    if not written:
        sys.exit(1)


def _check_gpu_samples(hz: float) -> None:
    from ..spec.config import MAX_GPU_SAMPLES

    if not 0 <= hz <= MAX_GPU_SAMPLES:
        raise UsageError("--gpu-samples takes 0 (off) to %d samples a second, not %g"
                         % (MAX_GPU_SAMPLES, hz))


def _check_return_sampling(every: int) -> None:
    """--return-sampling N: a power of two the kernel's sampling takes."""
    from ..spec.config import MAX_SAMPLE_RETURNS

    if every & (every - 1):
        raise UsageError("--return-sampling takes a power of two, not %d" % every)
    if every > MAX_SAMPLE_RETURNS:
        raise UsageError("--return-sampling takes at most %d, not %d"
                         % (MAX_SAMPLE_RETURNS, every))


def _monitor_flight(seconds: Optional[float], directory: str, size: str, errors: str,
                    latency: Optional[float]):
    if seconds is None:
        return None
    from ..monitor.flight import FlightOptions, parse_trigger_errors

    _positive_seconds(seconds, "--flight-recorder")
    if not os.path.isdir(directory):
        raise UsageError("--flight-dir %s is not a folder" % directory)
    ring = plan.parse_size(size)
    if ring < MIN_FLIGHT_SIZE:  # (a smaller ring keeps no batch of a busy second)
        raise UsageError("--flight-size takes at least 1M, not %s" % size)
    return FlightOptions(seconds, directory, parse_trigger_errors(errors),
                         int(latency * 1e9) if latency is not None else None, ring)


def _monitor_exporters(monitor, address, otlp: Optional[str], interval: float) -> List:
    """(exporter, where it goes in words) of --prometheus and --otlp, not started yet."""
    exporters: List = []
    if address is not None:
        from ..monitor.prometheus import MetricsServer

        monitor.add_exporter("prometheus")
        server = MetricsServer(address, functools.partial(monitor.collect, "prometheus"))
        host, port = server.address
        exporters.append((server, "metrics at http://%s:%d/metrics"
                          % ("[%s]" % host if ":" in host else host, port)))
    if otlp:
        from ..monitor.otlp import OtlpPusher

        monitor.add_exporter("otlp")
        pusher = OtlpPusher(otlp, interval, functools.partial(monitor.collect, "otlp"),
                            monitor.started_at, on_error=say)
        exporters.append((pusher, "pushing metrics to %s every %gs" % (pusher.url, interval)))
    return exporters


def _monitor_profile(monitor, stream, path: str) -> bool:
    """The run's pprof profile written; False (said in one line) when it cannot be."""
    from ..output import pprof

    try:
        stream.write(pprof.profile_of_monitor(monitor.collect("pprof"), monitor.launch_totals(),
                                              monitor.started_at))
        stream.flush()
    except OSError as err:
        say("cannot write %s: %s" % (path, err.strerror or err))
        return False
    say("pprof profile written to %s" % path)
    return True


MIN_FLIGHT_SIZE = 1 << 20
MAX_SECONDS = 366 * 86400.0  # (a longer wait overflows a timeout's time_t: a year will do)


def _positive_seconds(value: Optional[float], option: str) -> Optional[float]:
    """`value`, when it is a positive number of seconds (not nan, not inf) up to a year."""
    if value is not None and not 0 < value <= MAX_SECONDS:
        raise UsageError("%s takes a positive number of seconds up to a year, not %g"
                         % (option, value))
    return value
