"""`ebpf-cuda [OPTIONS] [-- COMMAND]`: the trace command, its options (options.py) → a `Tracer`
and the outputs `output/plan.py` makes; its stop signals are `signals.stopper`'s. Its usual
command lines are read without click (`options.parse_simple`); `trace_command()` is the click
command, made when the rest needs it (help, errors)."""
import sys
from typing import List, Optional, Tuple

from ..output import plan
from ..spec import apis
from ..spec.config import TraceConfig
from ..tracer import DEFAULT_RING_SIZE, Closing, Tracer
from .common import (check_analyze, check_split, echo, parse_cpus, pin_threads, print_report,
                     say, split_functions, stdout_closed_at_start)
from .options import click_command
from .signals import stopper

_COMMAND: list = []  # the click command, once made


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


def trace_command():
    """The trace command as click's command (made once: click's import is ~15 ms)."""
    if not _COMMAND:
        _COMMAND.append(click_command(trace))
    return _COMMAND[0]


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
