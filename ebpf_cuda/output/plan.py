"""What a run's output options ask for, made: the files (checked, then opened safely), the
sinks the events go to, the spool behind a text or JSON writer, the saved-trace writer, and
the end-of-run reports. The `trace` and `report` commands are thin faces on it; a library
user gets the same outputs from a `Request`:

    request = Request(summary=True, output="calls.txt")
    with Tracer(command=["./app"]) as tracer:
        plan = for_trace(request, tracer)
        tracer.trace_into(plan.sinks, save=plan.saver, spool=plan.spool)
        print("\\n\\n".join(plan.reports(tracer)))
"""
import os
import stat
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

from ..decode.losses import Losses
from ..errors import UsageError
from ..targets.discovery import resolve_executable
from ..value_class import ValueClass
from . import Sink
from .files import open_binary, open_output, trusted_symlink  # noqa: F401 (open_binary: the CLI)
from .outputs import Outputs, lines_only
from .text import TextWriter

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MAX_RING_SIZE = 1 << 31  # the kernel's ring buffer sizes are 32-bit; 2G is the largest here
# --summary alone: calls that teach kernel names travel (a framework's import registers tens of
# thousands of kernels in a burst: PyTorch's ~40,000 records), graph calls, and what a
# process does while it captures (issue 17): 8 MiB, ~50,000 records
SUMMARY_RING_SIZE = 8 << 20

Warn = Callable[[str], None]


def format_size(size: int) -> str:
    """8388608 → `8M` (the largest unit that divides it)."""
    for unit in ("G", "M", "K"):
        if size and size % _UNITS[unit] == 0:
            return "%d%s" % (size // _UNITS[unit], unit)
    return str(size)


def parse_size(text: str) -> int:
    """`8M` → 8388608; plain numbers are bytes."""
    text = text.strip().upper().rstrip("B").rstrip("I")
    unit = text[-1:] if text[-1:] in _UNITS else ""
    number = text[:-1] if unit else text
    if not number.isdigit():
        raise UsageError("bad size %r (examples: 65536, 256K, 8M)" % text)
    return int(number) * _UNITS[unit]


def ring_size(text: Optional[str], in_kernel: bool, default: int) -> int:
    """The ring buffer size asked for (`--ring-size`), or the default of the mode."""
    if text is not None:
        size = parse_size(text)
        if size > MAX_RING_SIZE:
            raise UsageError("the ring buffer size must be at most %s, not %s"
                             % (format_size(MAX_RING_SIZE), text))
        return size
    return SUMMARY_RING_SIZE if in_kernel else default


class Request(ValueClass):
    """The outputs of one run, as the options name them (None: not asked for)."""
    output: Optional[str] = None  # events as text or JSON lines to this file (-o), or stdout
    as_json: bool = False
    timestamps: bool = True
    summary: bool = False
    leaks: bool = False
    stacks: bool = False  # --leaks shows where each leak was allocated
    save: Optional[str] = None
    trace_out: Optional[str] = None
    report_html: Optional[str] = None
    pprof_out: Optional[str] = None
    spool_size: Optional[str] = None  # None: the default limit; "0": no spool
    calls_at_entry: bool = False  # no return probes: the profile counts calls at entry
    stdout_closed: bool = False  # the standard output was closed when the run began
    by_device: bool = False  # the summary's tables once per device
    by_container: bool = False  # ... once per container
    py_stacks: bool = False  # events carry their Python stacks (the kernel cannot sum them)
    analyze: bool = False  # --analyze: steps, wait bounds and findings at the end
    step_at: Optional[str] = None  # --step-at FUNCTION: what starts a step


    def summary_only(self) -> bool:
        """--summary and nothing that needs every event: the kernel can sum the calls up."""
        return self.summary and not any((self.leaks, self.as_json, self.output, self.save,
                                         self.trace_out, self.report_html, self.pprof_out,
                                         self.by_device, self.by_container,
                                         self.py_stacks, self.analyze))
        # (devices and containers come with the events)

    def reports_to_stderr(self) -> bool:
        """After JSON Lines on stdout, the reports go to stderr."""
        return self.as_json and self.output is None

    def files(self) -> List[Tuple[str, Optional[str]]]:
        """(option, path) of every file this request writes."""
        return [("-o", self.output), ("--save", self.save), ("--trace-out", self.trace_out),
                ("--report", self.report_html), ("--pprof-out", self.pprof_out)]


class Plan(ValueClass):
    """The outputs made from a request: `analyses` (the end-of-run reports' sinks) and the
    rest of `sinks`, the `spool` between the reader and the lines, the `saver` (--save)."""
    analyses: List[Sink]
    sinks: List[Sink]
    spool: object = None
    saver: object = None
    stacks: bool = False
    namer: object = None
    frames: object = None  # a saved trace's stacks, symbolized (SavedTrace.stack_frames)

    def reports(self, tracer=None) -> List[str]:
        """The reports of the analyses; live, rendered while `tracer` is still open (its
        in-kernel sums and its stack map)."""
        if not self.analyses:  # (a plain trace's exit imports no analysis)
            return []
        from ..analysis import LeakTracker, format_leaks

        reports = []
        for analysis in self.analyses:
            if getattr(analysis, "analyzes", False):  # (analyzer.Analyzer: its own report)
                reports.append(analysis.report())
            elif not isinstance(analysis, LeakTracker):  # a Summary, or a SplitSummary
                in_kernel = tracer is not None and not tracer.emit
                reports.append(analysis.report(tracer.aggregates() if in_kernel else None))
            else:
                stack = tracer.stack if tracer is not None and self.stacks else None
                resolver = self.namer.resolver if tracer is not None else None
                reports.append(format_leaks(analysis, stack, resolver) if resolver
                               else format_leaks(analysis, frames_of=self.frames))
        return reports


def summary_losses(losses: Losses) -> str:
    """The summary's last line when events were lost: its tables count only those seen."""
    return (" ** Not counted: %s (the tables above count only the events seen)"
            % losses.sentence())


def for_trace(request: Request, tracer, warn: Optional[Warn] = None) -> Plan:
    """The outputs of a live trace by `tracer` (not started yet)."""
    namer = tracer.names
    stacks = _stack_frames(tracer, namer) if request.stacks else None
    analyses = _analyses(namer, request, warn, stacks)
    _check_reports_stdout(request, analyses)
    sinks = analyses + _event_sinks(request, namer, events_wanted=not analyses and not (
        request.trace_out or request.report_html or request.save or request.pprof_out))
    sinks += _file_sinks(request, namer, analyses)
    if request.pprof_out:  # (only when asked for)
        from .pprof import PprofWriter

        sinks.append(_named(PprofWriter(open_binary(request.pprof_out),
                                        tracer.stack, namer.resolver, namer,
                                        calls_at_entry=request.calls_at_entry),
                            request.pprof_out))
    spool = (_spool(request.spool_size, request.output)
             if lines_only(sinks) is not None and not request.save else None)
    saver = _saver(request.save, tracer, namer)
    if saver is not None:
        saver.stacks = stacks  # (its trailer keeps the stacks, symbolised: for `analyze`)
    return Plan(analyses, sinks, spool, saver, request.stacks, namer)


def for_replay(request: Request, saved, warn: Optional[Warn] = None) -> Plan:
    """The outputs of a saved trace read again (`saved`: a savefile.SavedTrace)."""
    frames = saved.stack_frames if saved.stacks else None  # (saved with --stacks)
    analyses = _analyses(saved.namer, request, warn, frames)
    _check_reports_stdout(request, analyses)
    sinks = analyses + _event_sinks(request, saved.namer, events_wanted=not analyses and not (
        request.trace_out or request.report_html))
    return Plan(analyses, sinks + _file_sinks(request, saved.namer, analyses),
                namer=saved.namer, frames=frames)


def replay(saved, sinks: Sequence[Sink], notice: Optional[Warn] = None):
    """Every event of a saved trace to `sinks`, as a live trace hands them over (graph
    launches annotated with what they ran); the sinks are closed at the end. (the Outputs,
    with their failures; the trace's losses; the GraphTracker)."""
    from ..decode.graphs import GraphTracker

    outputs = Outputs(list(sinks), notice=notice, goes_on=False)
    graphs = GraphTracker(saved.namer)
    losses = Losses()
    outputs.header()
    try:
        lines = lines_only(sinks)
        if lines is not None:
            _replay_lines(saved, lines, graphs, outputs)
        else:
            _feed_gpu(saved, sinks)
        for events in saved.batches() if lines is None else ():
            graphs.annotate(events)
            for sink in sinks:
                if outputs.alive(sink):
                    outputs.call(sink, sink.write, events)
            outputs.flush()
            if outputs.nothing_left:
                break
        losses = saved.losses  # (a killed tracer's: its last loss note, now that all is read)
        for sink in sinks:  # the GPU's samples and events, as the live trace gave them
            tell = getattr(sink, "note_gpu", None)
            if tell is not None and saved.gpu and outputs.alive(sink):
                outputs.call(sink, tell, saved.gpu)
        for sink in sinks:  # the HTML report shows the losses too
            tell = getattr(sink, "note_losses", None)
            if tell is not None and outputs.alive(sink):
                outputs.call(sink, tell, losses)
    finally:
        outputs.close()
    return outputs, losses, graphs


def _replay_lines(saved, writer, graphs, outputs: Outputs) -> None:
    """A text or JSON writer alone: its lines straight from the frames (lines.py, as a live
    trace writes them), the records it does not format there decoded and annotated as
    `saved.batches()` would (the same lines: tests/test_lines.py, test_outputs_agree.py)."""
    from ..errors import DecodeError
    from . import DecodeContext

    decoder = saved.new_pass()

    def annotate(events) -> None:
        saved.annotate(events)
        graphs.annotate(events)
    writer.bind(DecodeContext(annotate, graphs, None, saved.devices, saved.names(),
                              _gpu_feed(saved)))
    try:
        for frames in saved.frames():
            if not outputs.alive(writer):
                break
            outputs.call(writer, writer.write_frames, frames, decoder)
            outputs.flush()
    except DecodeError as err:  # the file is named: a damaged record is the file's
        raise DecodeError("%s has a damaged record: %s" % (saved.path, err)) from None


def _gpu_feed(saved):
    """The saved GPU records for a text or JSON writer, among the calls (gpu/feed.py)."""
    if not saved.gpu:
        return None
    from ..gpu.feed import GpuFeed

    return GpuFeed(saved.gpu, [])


def _feed_gpu(saved, sinks: Sequence[Sink]) -> None:
    """Each text and JSON writer among other sinks gets the saved GPU records among the
    calls, as the live trace wrote them."""
    from . import LineWriter

    for sink in sinks:
        if isinstance(sink, LineWriter):
            sink.bind(sink.context._replace(gpu=_gpu_feed(saved)))


def _check_reports_stdout(request: Request, analyses: List[Sink]) -> None:
    if analyses and not request.reports_to_stderr() and request.stdout_closed:
        raise UsageError("stdout is closed: the reports would go there")


def _stack_frames(tracer, namer):
    """(pid, stack_id) → the frames of a user stack of the live trace (--stacks: the native
    callers of --analyze and of a saved trace), symbolised as --leaks does."""
    def frames(pid: int, stack_id: int):
        return namer.resolver.stack(pid, tracer.stack(stack_id))
    return frames


def _analyses(namer, request: Request, warn: Optional[Warn], stacks=None) -> List[Sink]:
    """Sinks that build end-of-run reports; leak warnings are told as they happen. Each
    imported only when asked for (the default trace has none: 4-7 ms of its start)."""
    analyses: List[Sink] = []
    if request.summary and (request.by_device or request.by_container):
        from ..analysis.summary import SplitSummary

        analyses.append(SplitSummary(namer, request.by_device, request.by_container))
    elif request.summary:
        from ..analysis.summary import Summary

        analyses.append(Summary(namer=namer))
    if request.analyze:
        from ..analysis.analyzer import Analyzer

        analyses.append(Analyzer(namer, request.step_at, as_json=request.as_json,
                                 stacks=stacks))
    if request.leaks:
        from ..analysis.memory import LeakTracker

        analyses.append(LeakTracker(on_warning=lambda w: warn("warning: %s" % w) if warn
                                    else None))
    return analyses


def _event_sinks(request: Request, namer, events_wanted: bool = True) -> List[Sink]:
    """Where decoded events go: text or JSON lines. With only end-of-run reports asked for
    (`events_wanted` False) and neither --json nor -o, no per-event writer at all."""
    if not events_wanted and not request.as_json and request.output is None:
        return []
    stream = open_output(request.output, request.stdout_closed)
    if request.as_json:
        from .jsonl import JsonWriter

        return [_named(JsonWriter(stream, namer=namer), request.output)]
    return [_named(TextWriter(stream, timestamps=request.timestamps, namer=namer),
                   request.output)]


def _file_sinks(request: Request, namer, analyses: Sequence[Sink] = ()) -> List[Sink]:
    """The timeline (--trace-out) and HTML report (--report) writers (the report shows the
    analysis of --analyze: the Analyzer among `analyses`)."""
    sinks: List[Sink] = []
    if request.trace_out:
        from .chrome_trace import ChromeTraceWriter  # only when asked for

        sinks.append(_named(ChromeTraceWriter(open_output(request.trace_out, request.stdout_closed),
                                              namer=namer), request.trace_out))
    if request.report_html:
        from .html_report import HtmlReport  # only when asked for

        report = HtmlReport(open_output(request.report_html, request.stdout_closed), namer=namer)
        report.analyzer = next((a for a in analyses if getattr(a, "analyzes", False)), None)
        sinks.append(_named(report, request.report_html))
    return sinks


def _named(sink, path: Optional[str]):
    """The output as its write errors name it: the path given, or stdout."""
    sink.output_name = path or "stdout"
    return sink


def _saver(path: Optional[str], tracer, namer):
    """With --save: the raw-trace writer (it learns kernel names for its trailer)."""
    if not path:
        return None
    from . import rank_files, savefile

    if rank_files.is_pattern(path):  # run-%r.ebpfcuda: a file per process (rank_files.py)
        rank_files.check_pattern(path)
        saver = rank_files.RankFiles(path, tracer.apis_table, tracer.decoder.clock_offset_ns,
                                     namer)
        saver.from_start = bool(tracer.config.command)
        return saver
    trusted_symlink(path)  # another user's symbolic link is refused, as for -o
    saver = savefile.open_save(path, tracer.apis_table, tracer.decoder.clock_offset_ns, namer)
    saver.from_start = bool(tracer.config.command)  # (each event's device: devices.py)
    return saver


def _spool(size: Optional[str], output: Optional[str]):
    """The spool between the ring reader and the lines (None with --spool-size 0)."""
    from .spool import DEFAULT_LIMIT, MEMORY, Spool

    limit = DEFAULT_LIMIT if size is None else parse_size(size)
    if limit == 0:
        return None
    # Beside the output file (its disk has room for what is written there anyway); not
    # beside /dev/null or a FIFO, nor in /dev for -o /dev/stdout: in $TMPDIR then.
    directory = None
    real = os.path.realpath(output) if output else None
    if real and os.path.isfile(real) and not real.startswith(("/dev/", "/proc/")):
        directory = os.path.dirname(real)
    try:
        return Spool(directory, limit, memory=min(MEMORY, limit))
    except OSError as err:
        raise UsageError("cannot create a spool file in %s: %s (--spool-size 0 does without)"
                         % (directory or "$TMPDIR", err.strerror)) from None


# -- files -------------------------------------------------------------------------------------

def _identity(path: str) -> Tuple[str, Optional[Tuple[int, int]], bool]:
    """(real path, (device, inode) when it exists, True for a character device)."""
    real = os.path.realpath(path)
    try:
        st = os.stat(path)
    except OSError:
        return real, None, False
    return real, (st.st_dev, st.st_ino), stat.S_ISCHR(st.st_mode)


def refuse_same_files(outputs: Iterable[Tuple[str, Optional[str]]],
                      inputs: Iterable[Tuple[str, Optional[str]]] = ()) -> None:
    """UsageError when two outputs, or an output and an input, are one file, by path or by
    device and inode (a link, a bind mount), before anything is opened for writing (opening
    truncates). Character devices (/dev/null, a terminal) may take several outputs."""
    known = []
    for what, path in inputs:
        if path:
            known.append((what, path, True) + _identity(path)[:2])
    outputs = list(outputs)
    _refuse_pattern_matches(outputs)
    for what, path in outputs:
        if not path:
            continue
        real, node, chardev = _identity(path)
        if chardev:
            continue
        for other, other_path, is_input, other_real, other_node in known:
            if real == other_real or (node is not None and node == other_node):
                if is_input:
                    raise UsageError("%s %s is the same file as %s %s: it would be "
                                     "overwritten before it is read"
                                     % (what, path, other, other_path))
                raise UsageError("%s %s and %s %s are the same file: give each output a "
                                 "file of its own" % (other, other_path, what, path))
        known.append((what, path, False, real, node))


def _refuse_pattern_matches(outputs: Sequence[Tuple[str, Optional[str]]]) -> None:
    """A per-process `--save` pattern (`run-%r.ebpfcuda`) may name any file it matches:
    another output that matches it is refused too."""
    if not any(path and "%" in path for _, path in outputs):
        return  # (nothing more imported: the common case)
    import fnmatch

    from .rank_files import is_pattern

    for what, pattern in outputs:
        if not pattern or not is_pattern(pattern):
            continue
        glob = os.path.realpath(pattern.replace("%%", "\0").replace("%r", "*")
                                .replace("%p", "*").replace("\0", "%"))
        for other, path in outputs:
            if path and path != pattern and fnmatch.fnmatchcase(os.path.realpath(path), glob):
                raise UsageError("%s %s is a file %s %s may write: give each output a file "
                                 "of its own" % (other, path, what, pattern))


def trace_inputs(paths: Sequence[str], command: Sequence[str]) -> List[Tuple[str, str]]:
    """The files a live trace reads: the probed libraries, the command's executable."""
    inputs = [("-p", path) for path in paths]
    if command:
        inputs.append(("the command", resolve_executable(command[0]) or command[0]))
    return inputs
