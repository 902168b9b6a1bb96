"""The trace command's usual command lines are read without click (cli/options.py's
`parse_simple`, ~20 ms of every start): its values must be exactly click's, for every command
line it reads; the rest it leaves to click (help, errors, arguments among the options)."""
import contextlib
import io
import random
import subprocess
import sys

import click
import pytest

from ebpf_cuda.cli import options
from ebpf_cuda.cli.trace import trace_command
from helpers import REPO, cli_env

# Words command lines are made of: every option's spellings, joined short options, values
# (numbers, choices, words that look like options), arguments.
_OPTIONS = sorted({d for o in options.TRACE_OPTIONS for d in o.decls if d[:1] == "-"})
_WORDS = _OPTIONS + [
    "-vt", "-vv", "-tr", "-vp", "-pLIB", "-d5", "-d", "-vd7", "-o-", "-oout.txt", "-h",
    "--help", "--json=1", "--api=nccl", "--api=bad", "--api=", "--pid=12", "--pid=x",
    "--gpu-samples=0", "--gpu-samples=nan", "--functions=a,b", "--nope", "-x", "-",
    "--", "--", "5", "-5", "1.5", "1e3", " 7", "nan", "all", "driver", "runtime", "", "=",
    "./app", "lib.so", "a,b", "0,2-3", "8M"]


def click_params(argv):
    """click's values for `argv`, or None where it refuses it (or shows its help)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # (the help it would show)
            with trace_command().make_context("ebpf-cuda", list(argv)) as ctx:
                return dict(ctx.params)
    except (click.ClickException, click.exceptions.Exit):
        return None


def same(fast, slow) -> bool:
    """Equal values of equal types (1 is not 1.0, True is not 1)."""
    return fast.keys() == slow.keys() and all(
        type(fast[k]) is type(slow[k]) and (fast[k] == slow[k] or fast[k] != fast[k])
        for k in fast)  # (nan == nan: both nan)


def test_random_command_lines_read_as_click_reads_them():
    rng = random.Random(36)
    read = 0
    for _ in range(4000):
        argv = [rng.choice(_WORDS) for _ in range(rng.randint(0, 7))]
        fast = options.parse_simple(argv)
        if fast is None:
            continue  # (click's to parse: nothing to compare)
        read += 1
        slow = click_params(argv)
        assert slow is not None, argv
        assert same(fast, slow), (argv, fast, slow)
    assert read > 800  # (the comparison is not vacuous)


USUAL = [
    [],
    ["-p", "/lib/libcudart.so.12", "--", "./app", "--flag", "-v"],
    ["--", "python3", "train.py", "--epochs", "3"],
    ["-t", "-o", "trace.txt", "--functions", "cudaMalloc,cudaFree", "--", "./app", "x"],
    ["--json", "--summary", "-o", "out.jsonl", "--ring-size", "8M", "--", "./app"],
    ["-vv", "-d", "1234", "--api", "driver", "--gpu-samples", "0"],
    ["--all", "--no-follow", "--py-stacks", "--stacks", "--leaks", "--", "./app"],
    ["--analyze", "--step-at=train_step", "--save", "run.ebpfcuda", "--", "./app"],
    ["-vtr", "-pLIB", "--cpu", "0", "--nvml", "/x/libnvidia-ml.so.1", "--", "./app"],
    ["--summary", "--by-device", "--by-container", "--trace-out", "t.json", "--report",
     "r.html", "--pprof-out", "p.pb.gz", "--spool-size", "0", "--entries", "--", "./app"],
    ["-o", "-", "--", "./app"],
    ["--list-functions"],
]


@pytest.mark.parametrize("argv", USUAL, ids=range(len(USUAL)))
def test_usual_command_lines_need_no_click(argv):
    fast = options.parse_simple(argv)
    assert fast is not None, argv
    assert same(fast, click_params(argv)), argv


@pytest.mark.parametrize("argv", [
    ["--help"], ["-h"], ["./app"], ["-p", "lib", "./app"], ["--bogus"], ["-d", "x"],
    ["--api", "gpu"], ["-o"], ["--json=1"], ["-d", "1", "-d", "2"], ["-vx"], ["-"],
], ids=range(12))
def test_what_click_must_say_or_decide_is_left_to_it(argv):
    assert options.parse_simple(argv) is None


def test_shell_completion_is_left_to_click(monkeypatch):
    monkeypatch.setenv(options.COMPLETE_VARIABLE, "bash_complete")
    assert options.parse_simple(["--json"]) is None


def test_the_table_is_the_commands_options():
    """click's command is made from the table: the same names, in the same order, with the
    defaults parse_simple starts from."""
    command = trace_command()
    names = [p.name for p in command.params]
    assert names == [options.dest(o) for o in options.TRACE_OPTIONS] + [options.COMMAND]
    assert click_params([]) == options.defaults()


def test_a_usual_start_imports_no_click():
    """`--list-functions` runs the trace command through parse_simple: click is not imported
    (nor what it imports for its messages: gettext, difflib)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "ebpf_cuda",
                           "--list-functions"], capture_output=True, text=True, cwd=str(REPO),
                          env=cli_env(), timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "cudaMalloc" in done.stdout
    modules = [line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
               if line.startswith("import time:")]
    assert "ebpf_cuda.cli.options" in modules
    assert [m for m in modules if m.split(".")[0] in ("click", "gettext", "difflib")] == []


def _stream(encoding: str):
    return io.TextIOWrapper(io.BytesIO(), encoding=encoding, errors="backslashreplace")


@pytest.mark.parametrize("text", ["ebpf-cuda: probing 3 functions in /x/lib.so", "",
                                  "caf\u00e9 \udcff", "\x1b[31mred\x1b[0m name"],
                         ids=["plain", "empty", "odd bytes", "escape sequence"])
@pytest.mark.parametrize("make", [lambda: _stream("utf-8"), lambda: _stream("ascii"),
                                  io.StringIO], ids=["utf-8", "ascii", "StringIO"])
@pytest.mark.parametrize("err", [True, False], ids=["stderr", "stdout"])
def test_lines_are_written_as_click_echo_writes_them(monkeypatch, text, make, err):
    """common.write_line (the CLI's lines, without click's import) writes what click.echo
    writes, to every kind of stream (a stream it does not write as it is goes to click)."""
    from ebpf_cuda.cli.common import write_line

    written = []
    for write in (write_line, click.echo):
        stream = make()
        monkeypatch.setattr(sys, "stderr" if err else "stdout", stream)
        write(text, err=err)
        monkeypatch.undo()
        stream.flush()
        written.append(stream.getvalue() if isinstance(stream, io.StringIO)
                       else stream.buffer.getvalue())
    assert written[0] == written[1]
