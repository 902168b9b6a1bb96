"""`ebpf-cuda [OPTIONS] [-- COMMAND]`: the trace command, its options → a `Tracer` and the
outputs `output/plan.py` makes; its stop signals are `signals.stopper`'s."""
import sys
from typing import List, Optional, Tuple

import click

from ..output import plan
from ..spec import apis
from ..spec.config import TraceConfig
from ..tracer import DEFAULT_RING_SIZE, Closing, Tracer
from .common import (check_analyze, check_split, echo, parse_cpus, pin_threads, print_report,
                     say, split_functions, stdout_closed_at_start)
from .signals import stopper


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True,
              help="Say which files and offsets are probed (-vv: also the programs).")
@click.option("-t", "--no-timestamps", is_flag=True, help="Leave the time column out.")
@click.option("-r", "--no-returns", is_flag=True,
              help="Entry probes only: no return probes are attached, no [EXIT] lines.")
@click.option("-p", "--path", "paths", multiple=True, metavar="PATH",
              help="Library or executable to probe (repeatable). Default: found automatically.")
@click.option("-d", "--pid", type=int, help="Trace only this process (filtered in the kernel).")
@click.option("--functions", metavar="NAME,...",
              help="Functions to trace, by name or glob (default: the default set).")
@click.option("--all", "everything", is_flag=True,
              help="Trace every function of the table, also the chatty ones left out by "
                   "default (cudaGetDevice, cudaGetLastError, ...).")
@click.option("--api", type=click.Choice(["runtime", "driver", "nccl", "all"]), default="all",
              show_default=True,
              help="Which layer to trace (all: NCCL too, where a libnccl is found).")
@click.option("--no-follow", is_flag=True,
              help="With a command: trace only its own process (filtered in the kernel), "
                   "not the processes it starts.")
@click.option("--json", "as_json", is_flag=True, help="JSON Lines, one object per event.")
@click.option("-o", "--output", metavar="FILE", help="Write events to FILE instead of stdout.")
@click.option("--ring-size", metavar="SIZE",
              help="Ring buffer size (power of two, e.g. 256K, 8M; default 4M, or 8M with "
                   "--summary alone, whose records come in bursts: kernel registrations, "
                   "captures).")
@click.option("--spool-size", metavar="SIZE",
              help="Text and JSON: how much backlog may wait on disk (an unlinked file beside "
                   "the output, or in $TMPDIR) while lines are written slower than calls come; "
                   "past it, events are dropped and counted. Default 2G; 0: none, lines are "
                   "written as the ring buffer is read.")
@click.option("--entries", is_flag=True,
              help="Also emit each call's entry as it happens (for calls that block).")
@click.option("--list-functions", is_flag=True, help="List the traceable functions and exit.")
@click.option("--summary", is_flag=True,
              help="At the end, print summary tables (nsys stats style): time per function, "
                   "memory operations, copy bandwidth, errors, kernels. Without --json or -o, "
                   "no per-event lines.")
@click.option("--by-device", is_flag=True,
              help="With --summary: the tables once per GPU, each call under the device it "
                   "targets (its thread's current device; JSON events carry it as `device`).")
@click.option("--by-container", is_flag=True,
              help="With --summary: the tables once per container (JSON: `container`).")
@click.option("--leaks", is_flag=True,
              help="Flag double frees and frees of unknown pointers as they happen; at the "
                   "end, list the allocations never freed.")
@click.option("--stacks", is_flag=True,
              help="Capture the user call stack of memory calls (--leaks shows where each "
                   "leak was allocated) and of those --analyze names (their native callers).")
@click.option("--py-stacks", is_flag=True,
              help="Each call carries its thread's Python stack (file, executing line, "
                   "function), walked by the probe: JSON `py_stack`, ` at FILE:LINE (FUNCTION)` "
                   "on text lines, a summary table by Python line. CPython 3.8-3.14.")
@click.option("--analyze", is_flag=True,
              help="At the end: the program's steps (loop iterations), where the host waits "
                   "on the GPU, and findings (what to change); with --json as JSON records. "
                   "Best with --py-stacks (findings name Python lines) or --stacks (native "
                   "callers). See docs/analysis.md.")
@click.option("--step-at", metavar="FUNCTION",
              help="With --analyze: each call of this CUDA function, or each invocation of "
                   "this Python function (--py-stacks) or native function (--stacks: "
                   "`train_step` also names `train_step(int)`), starts a step.")
@click.option("--save", metavar="FILE",
              help="Record the raw trace to FILE, for `ebpf-cuda report FILE` (or "
                   "`analyze FILE`) later.")
@click.option("--trace-out", metavar="FILE.json",
              help="Write a timeline in Chrome trace format (open in Perfetto UI).")
@click.option("--report", "report_html", metavar="FILE.html",
              help="Write a self-contained HTML report (tables and plots).")
@click.option("--pprof-out", metavar="FILE",
              help="Write a pprof profile (gzipped profile.proto: go tool pprof, Pyroscope, "
                   "Parca) of calls, API time, launches, bytes allocated and copied, by "
                   "function, kernel and, with --stacks, caller.")
@click.option("--gpu-samples", type=float, metavar="HZ",
              help="Sample every GPU's state (utilisation, memory, power, clocks, throttling, "
                   "ECC; per process memory and utilisation; GPM metrics on Hopper) HZ times "
                   "a second through NVML, and its Xid and ECC events, beside the calls "
                   "(default 10; 0: off). See docs/gpu-state.md.")
@click.option("--nvml", "nvml_path", metavar="PATH",
              help="The libnvidia-ml.so.1 to read (default: as the loader finds it, then the "
                   "drivers' folders).")
@click.option("--cpu", "cpu_list", metavar="LIST",
              help="Run the tracer's threads on these CPUs only (e.g. 0 or 0,2-3), away from "
                   "the traced program's; the command keeps all of its CPUs.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def trace(verbose: int, no_timestamps: bool, no_returns: bool, paths: Tuple[str, ...],
          pid: Optional[int], functions: Optional[str], everything: bool, api: str,
          no_follow: bool, as_json: bool, output: Optional[str],
          ring_size: Optional[str], spool_size: Optional[str], entries: bool,
          list_functions: bool, summary: bool, by_device: bool, by_container: bool,
          leaks: bool, stacks: bool, py_stacks: bool, analyze: bool, step_at: Optional[str],
          save: Optional[str], trace_out: Optional[str],
          report_html: Optional[str], pprof_out: Optional[str],
          gpu_samples: Optional[float], nvml_path: Optional[str], cpu_list: Optional[str],
          command: Tuple[str, ...]) -> None:
    """Trace the CUDA calls of a program: ebpf-cuda [OPTIONS] [-- COMMAND [ARGS...]]"""
    if list_functions:
        rows = ["%-32s %-8s %s" % (row.name, row.library, "with --all" if not row.default
                                   else "default*" if apis.driver_replaces(row)
                                   else "default") for row in apis.TABLE]
        rows.append("* not when the driver's launch functions are probed too: the driver sees "
                    "every launch")
        if not print_report("\n".join(rows)):
            sys.exit(1)
        return
    check_split(summary, by_device, by_container)
    check_analyze(analyze, step_at, no_returns)
    cpus = parse_cpus(cpu_list) if cpu_list is not None else None
    request = plan.Request(output, as_json, not no_timestamps, summary, leaks, stacks, save,
                           trace_out, report_html, pprof_out, spool_size, no_returns,
                           stdout_closed_at_start(), by_device, by_container, py_stacks,
                           analyze, step_at)
    in_kernel = request.summary_only() and not no_returns  # the kernel sums the calls up
    stopper.checkpoint()
    if pid is not None:
        _check_process_id(pid)
    tracer = Tracer(TraceConfig(
        functions=split_functions(functions), library=list(paths), pid=pid,
        command=list(command), api=api, everything=everything, follow_children=not no_follow,
        return_probes=not no_returns, entries=entries,
        ring_size=plan.ring_size(ring_size, in_kernel, DEFAULT_RING_SIZE), stacks=stacks,
        aggregate=in_kernel, emit=not in_kernel, log=_log(verbose), py_stacks=py_stacks,
        gpu_samples=DEFAULT_GPU_SAMPLES if gpu_samples is None else gpu_samples,
        nvml=nvml_path, gpu_absent_ok=gpu_samples is None))
    stopper.tracer = tracer
    stopper.checkpoint()
    # Nothing is opened for writing before every output is known to be a file of its own.
    plan.refuse_same_files(request.files(), plan.trace_inputs(paths, command))
    outputs = plan.for_trace(request, tracer, warn=say)
    stopper.spool = outputs.spool
    tracer.start(meanwhile=lambda: tracer.stream.prepare_lines(  # (while the kernel verifies)
        outputs.sinks, save=outputs.saver, spool=outputs.spool))
    with tracer:
        if cpus is not None:  # (the command, forked and held by now, keeps its CPUs)
            pin_threads(cpus)
        stopper.checkpoint()  # (from here on a stop signal cancels a command held)
        _report_start(tracer, verbose)
        tracer.trace_into(outputs.sinks, save=outputs.saver, spool=outputs.spool,
                          reader_nice=READER_NICE, notice=say)
        stopper.checkpoint()  # a command cancelled before it ran
        reports = outputs.reports(tracer)
        closing = tracer.closing()
        tracer.close(wait=False)  # this process exits now: a child detaches the probes
    _finish(closing, reports, request.reports_to_stderr(), summary)


def _finish(closing: Closing, reports: List[str], reports_err: bool, summary: bool) -> None:
    """The end of a live trace: what the tracer tells (Tracer.closing) around the reports,
    and the exit code (the command's when it ran; 1 when an output failed without one)."""
    for line in closing.left_running:
        say(line)
    losses = closing.losses
    if reports and summary and losses.read().total:  # the summary says what it did not see
        reports[0] += "\n\n" + plan.summary_losses(losses.read())
    printed = print_report("\n\n".join(reports), err=reports_err) if reports else True
    for line in closing.lines:
        say(line)
    if closing.exit_status is not None:
        sys.exit(closing.exit_status)
    if not printed:
        sys.exit(1)


DEFAULT_GPU_SAMPLES = 10.0  # a sample every 100 ms (--gpu-samples)
READER_NICE = -10  # the CPU weight of ~9 ordinary threads (sched_prio_to_weight): a program
# with more busy threads than cores cannot starve the reader (the lines thread inherits it)


def _report_start(tracer: Tracer, verbose: int) -> None:
    files = sorted({a.path for a in tracer.attachments})
    say("probing %d functions in %s" % (len({a.api for a in tracer.attachments}),
                                        ", ".join(files)))
    for failure in tracer.failures:
        say("warning: %s" % failure)
    if verbose >= 2:  # each program once, with the functions that share it
        users: dict = {}
        for (name, retprobe), program in tracer.programs.items():
            users.setdefault(id(program), (program, retprobe, []))[2].append(name)
        for program, retprobe, names in users.values():
            echo("-- %s %s (%s) --\n%s" % (program.name, "return" if retprobe else "entry",
                                           ", ".join(names), program.disassembly()))


def _check_process_id(pid: int) -> None:
    """-d takes a process: a thread's id is refused with its process's id."""
    from ..errors import ProcessError

    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            status = f.read()
    except (OSError, OverflowError):
        return  # the tracer's own check says what is wrong with it
    for line in status.splitlines():
        if line.startswith(b"Tgid:"):
            tgid = int(line.split()[1])
            if tgid != pid:
                raise ProcessError("%d is a thread of process %d: -d takes a process id "
                                   "(-d %d traces all its threads)" % (pid, tgid, tgid))
            return


def _log(verbose: int):
    """-v's notes (None without -v: what only they would print is not made)."""
    return echo if verbose else None
