"""The trace command's options, one table: click's command is made from it (`click_command`:
help, errors, every unusual command line), and `parse_simple` reads the usual command lines
with it without importing click (its import and first parse were ~20 ms of every start,
docs/performance.md). `parse_simple` gives exactly the values click gives, or None, and then
click parses (tests/test_cli_options.py compares the two over many command lines)."""
import os
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple


class Opt(NamedTuple):
    """One option: click's declarations, what it takes (`kind`), and its help."""

    decls: Tuple[str, ...]
    kind: str  # flag, count, text, multiple (text, repeatable), int, float, choice
    help: str
    metavar: Optional[str] = None
    choices: Tuple[str, ...] = ()  # kind "choice": the values it takes
    default: Optional[str] = None  # kind "choice": its value when not given (shown in help)


TRACE_OPTIONS: Tuple[Opt, ...] = (
    Opt(("-v", "--verbose"), "count",
        "Say which files and offsets are probed (-vv: also the programs)."),
    Opt(("-t", "--no-timestamps"), "flag", "Leave the time column out."),
    Opt(("-r", "--no-returns"), "flag",
        "Entry probes only: no return probes are attached, no [EXIT] lines."),
    Opt(("-p", "--path", "paths"), "multiple",
        "Library or executable to probe (repeatable). Default: found automatically.", "PATH"),
    Opt(("-d", "--pid"), "int", "Trace only this process (filtered in the kernel)."),
    Opt(("--functions",), "text",
        "Functions to trace, by name or glob (default: the default set).", "NAME,..."),
    Opt(("--all", "everything"), "flag",
        "Trace every function of the table, also the chatty ones left out by default "
        "(cudaGetDevice, cudaGetLastError, ...)."),
    Opt(("--api",), "choice", "Which layer to trace (all: NCCL too, where a libnccl is found).",
        choices=("runtime", "driver", "nccl", "all"), default="all"),
    Opt(("--no-follow",), "flag",
        "With a command: trace only its own process (filtered in the kernel), not the "
        "processes it starts."),
    Opt(("--json", "as_json"), "flag", "JSON Lines, one object per event."),
    Opt(("-o", "--output"), "text", "Write events to FILE instead of stdout.", "FILE"),
    Opt(("--ring-size",), "text",
        "Ring buffer size (power of two, e.g. 256K, 8M; default 4M, or 8M with --summary "
        "alone, whose records come in bursts: kernel registrations, captures).", "SIZE"),
    Opt(("--spool-size",), "text",
        "Text and JSON: how much backlog may wait on disk (an unlinked file beside the "
        "output, or in $TMPDIR) while lines are written slower than calls come; past it, "
        "events are dropped and counted. Default 2G; 0: none, lines are written as the ring "
        "buffer is read.", "SIZE"),
    Opt(("--entries",), "flag",
        "Also emit each call's entry as it happens (for calls that block)."),
    Opt(("--list-functions",), "flag", "List the traceable functions and exit."),
    Opt(("--summary",), "flag",
        "At the end, print summary tables (nsys stats style): time per function, memory "
        "operations, copy bandwidth, errors, kernels. Without --json or -o, no per-event "
        "lines."),
    Opt(("--by-device",), "flag",
        "With --summary: the tables once per GPU, each call under the device it targets (its "
        "thread's current device; JSON events carry it as `device`)."),
    Opt(("--by-container",), "flag",
        "With --summary: the tables once per container (JSON: `container`)."),
    Opt(("--leaks",), "flag",
        "Flag double frees and frees of unknown pointers as they happen; at the end, list the "
        "allocations never freed."),
    Opt(("--stacks",), "flag",
        "Capture the user call stack of memory calls (--leaks shows where each leak was "
        "allocated) and of those --analyze names (their native callers)."),
    Opt(("--py-stacks",), "flag",
        "Each call carries its thread's Python stack (file, executing line, function), walked "
        "by the probe: JSON `py_stack`, ` at FILE:LINE (FUNCTION)` on text lines, a summary "
        "table by Python line. CPython 3.8-3.14."),
    Opt(("--analyze",), "flag",
        "At the end: the program's steps (loop iterations), where the host waits on the GPU, "
        "and findings (what to change); with --json as JSON records. Best with --py-stacks "
        "(findings name Python lines) or --stacks (native callers). See docs/analysis.md."),
    Opt(("--step-at",), "text",
        "With --analyze: each call of this CUDA function, or each invocation of this Python "
        "function (--py-stacks) or native function (--stacks: `train_step` also names "
        "`train_step(int)`), starts a step.", "FUNCTION"),
    Opt(("--save",), "text",
        "Record the raw trace to FILE, for `ebpf-cuda report FILE` (or `analyze FILE`) "
        "later.", "FILE"),
    Opt(("--trace-out",), "text",
        "Write a timeline in Chrome trace format (open in Perfetto UI).", "FILE.json"),
    Opt(("--report", "report_html"), "text",
        "Write a self-contained HTML report (tables and plots).", "FILE.html"),
    Opt(("--pprof-out",), "text",
        "Write a pprof profile (gzipped profile.proto: go tool pprof, Pyroscope, Parca) of "
        "calls, API time, launches, bytes allocated and copied, by function, kernel and, with "
        "--stacks, caller.", "FILE"),
    Opt(("--gpu-samples",), "float",
        "Sample every GPU's state (utilisation, memory, power, clocks, throttling, ECC; per "
        "process memory and utilisation; GPM metrics on Hopper) HZ times a second through "
        "NVML, and its Xid and ECC events, beside the calls (default 10; 0: off). See "
        "docs/gpu-state.md.", "HZ"),
    Opt(("--nvml", "nvml_path"), "text",
        "The libnvidia-ml.so.1 to read (default: as the loader finds it, then the drivers' "
        "folders).", "PATH"),
    Opt(("--cpu", "cpu_list"), "text",
        "Run the tracer's threads on these CPUs only (e.g. 0 or 0,2-3), away from the traced "
        "program's; the command keeps all of its CPUs.", "LIST"),
)
COMMAND = "command"  # the trace command's one argument: the command line after the options
HELP_OPTIONS = ["-h", "--help"]
COMPLETE_VARIABLE = "_EBPF_CUDA_COMPLETE"  # click's shell completion (it parses then)
_TAKES_VALUE = {"text", "multiple", "int", "float", "choice"}
_CONVERT: Dict[str, Callable[[str], object]] = {"int": int, "float": float}


def dest(option: Opt) -> str:
    """The option's parameter name, as click names it: the declaration that is a name, else
    the first long option's without its dashes."""
    names = [d for d in option.decls if d[:1] != "-"]
    if names:
        return names[0]
    longs = [d for d in option.decls if d[:2] == "--"] or list(option.decls)
    return longs[0].lstrip("-").replace("-", "_").lower()


def defaults() -> Dict[str, object]:
    """Each parameter's value when its option is not given."""
    empty = {"flag": False, "count": 0, "multiple": ()}
    values = {dest(o): o.default if o.kind == "choice" else empty.get(o.kind)
              for o in TRACE_OPTIONS}
    values[COMMAND] = ()
    return values


_LONG = {d: o for o in TRACE_OPTIONS for d in o.decls if d[:2] == "--"}
_SHORT = {d[1]: o for o in TRACE_OPTIONS for d in o.decls if len(d) == 2 and d[0] == "-"}


def parse_simple(args: Sequence[str]) -> Optional[Dict[str, object]]:
    """The trace command's parameters from `args` as click would give them, or None where
    click must parse (help, an error, an option given twice, arguments before `--`, shell
    completion). Options as click reads them: `--name VALUE`, `--name=VALUE`, `-x VALUE`,
    `-xVALUE`, flags joined (`-vt`); the command after `--`."""
    if os.environ.get(COMPLETE_VARIABLE):
        return None
    values = defaults()
    seen: set = set()
    pending: List[str] = list(args)
    while pending:
        arg = pending.pop(0)
        if arg == "--":
            values[COMMAND] = tuple(pending)
            break
        if arg[:1] != "-" or len(arg) == 1:
            return None  # (click takes arguments among the options: left to it)
        given = _long_option(arg, pending) if arg[:2] == "--" else _short_options(arg, pending)
        if given is None:
            return None
        for option, value in given:
            if not _store(values, seen, option, value):
                return None
    return values


def _long_option(arg: str, pending: List[str]) -> Optional[List[Tuple[Opt, Optional[str]]]]:
    name, equals, value = arg.partition("=")
    option = _LONG.get(name)
    if option is None or (equals and option.kind not in _TAKES_VALUE):
        return None
    if option.kind in _TAKES_VALUE and not equals:
        if not pending:
            return None
        value = pending.pop(0)  # (whatever it is, as click takes it)
    return [(option, value if option.kind in _TAKES_VALUE else None)]


def _short_options(arg: str, pending: List[str]) -> Optional[List[Tuple[Opt, Optional[str]]]]:
    given: List[Tuple[Opt, Optional[str]]] = []
    for at, letter in enumerate(arg[1:], 2):
        option = _SHORT.get(letter)
        if option is None:
            return None
        if option.kind not in _TAKES_VALUE:
            given.append((option, None))
            continue
        if at < len(arg):  # the rest of the word is its value
            return given + [(option, arg[at:])]
        if not pending:
            return None
        return given + [(option, pending.pop(0))]
    return given


def _store(values: Dict[str, object], seen: set, option: Opt, value: Optional[str]) -> bool:
    """Note one option given; False where click must say what is wrong, or decide."""
    name = dest(option)
    if option.kind == "flag":
        values[name] = True
    elif option.kind == "count":
        values[name] += 1  # type: ignore[operator]
    elif option.kind == "multiple":
        values[name] += (value,)  # type: ignore[operator]
    elif name in seen:
        return False  # (a second value: click's to take)
    elif option.kind == "choice":
        if value not in option.choices:
            return False
        values[name] = value
    elif option.kind in _CONVERT:
        try:
            values[name] = _CONVERT[option.kind](value)  # type: ignore[arg-type]
        except ValueError:
            return False
    else:
        values[name] = value
    seen.add(name)
    return True


def click_command(callback: Callable[..., None]):
    """The click command of `callback` with TRACE_OPTIONS (its help is the docstring)."""
    import click

    types = {"int": int, "float": float}
    function = click.argument(COMMAND, nargs=-1, type=click.UNPROCESSED)(callback)
    for option in reversed(TRACE_OPTIONS):  # (as decorators: the last one applied first)
        keywords: Dict[str, object] = {"help": option.help}
        if option.metavar is not None:
            keywords["metavar"] = option.metavar
        if option.kind in ("flag", "count", "multiple"):
            keywords[{"flag": "is_flag", "count": "count", "multiple": "multiple"}[
                option.kind]] = True
        elif option.kind == "choice":
            keywords.update(type=click.Choice(list(option.choices)), default=option.default,
                            show_default=True)
        elif option.kind in types:
            keywords["type"] = types[option.kind]
        function = click.option(*option.decls, **keywords)(function)
    return click.command(context_settings={"help_option_names": HELP_OPTIONS})(function)
