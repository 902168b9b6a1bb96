"""Calls nested on one thread: each thread keeps its calls in flight on a small stack in task
storage (record.TASK_DEPTH deep). Up to that depth every call is seen; deeper, the calls that
did not fit are counted (stats "too_deep"), never silently missing."""
import pytest

from ebpf_cuda.spec import record
from fakecuda import LIB_FLAGS, SONAME, VERSION_SCRIPT
from helpers import trace_command

pytestmark = pytest.mark.kernel
TIMES = 100


@pytest.fixture(scope="module")
def nesting(cc):
    folder = cc.outdir / "nest"
    folder.mkdir(exist_ok=True)
    script = folder / "libcudart.map"
    script.write_text(VERSION_SCRIPT)
    lib = cc.shared("nest_stub.c", "nest/" + SONAME,
                    extra=[*LIB_FLAGS, "-Wl,--version-script=" + str(script)])
    prog = cc.executable("nest_prog.c", "nest/nest_prog",
                         extra=["-L", str(folder), "-l:" + SONAME, "-Wl,-rpath," + str(folder)])
    return lib, prog


@pytest.mark.parametrize("depth", [1, 2, 4, record.TASK_DEPTH])
def test_every_call_is_seen_up_to_the_stack_depth(root, nesting, depth):
    lib, prog = nesting
    events, _, tracer = trace_command([prog, depth, TIMES], library=[str(lib)],
                                      functions=["cudaMemcpy"])
    exits = [e for e in events if e.phase == "exit"]
    assert len(exits) == depth * TIMES
    assert sorted({e.args["size"] for e in exits}) == list(range(1, depth + 1))
    assert tracer.stats_at_end["too_deep"] == 0 and tracer.stats_at_end["lost"] == 0


def test_deeper_calls_are_counted_not_lost_silently(root, nesting):
    lib, prog = nesting
    depth = record.TASK_DEPTH + 2
    events, _, tracer = trace_command([prog, depth, TIMES], library=[str(lib)],
                                      functions=["cudaMemcpy"])
    exits = [e for e in events if e.phase == "exit"]
    stats = tracer.stats_at_end
    assert stats["too_deep"] > 0
    assert len(exits) + stats["too_deep"] == depth * TIMES  # each missing call is counted


def test_the_cli_says_how_many_calls_were_nested_too_deep(root, nesting):
    from helpers import run_cli

    lib, prog = nesting
    depth = record.TASK_DEPTH + 2
    done = run_cli("-o", "/dev/null", "-p", lib, "--functions", "cudaMemcpy", "--", prog,
                   depth, TIMES)
    assert done.returncode == 0, done.stderr
    assert ("%d events lost: %d calls nested deeper than %d on one thread"
            % ((depth - 2) * TIMES, (depth - 2) * TIMES, record.TASK_DEPTH)) in done.stderr


@pytest.mark.parametrize("jumps", [record.TASK_DEPTH + 2, 3 * record.TASK_DEPTH])
def test_calls_left_by_longjmp_are_not_counted_as_lost(root, nesting, jumps):
    """Calls left by longjmp never return: their entries stay on the thread's stack until it
    fills and is emptied. No call that returned is missing then, so nothing was lost: the
    calls that return afterwards are every one traced, and no loss is counted or said."""
    from helpers import run_cli

    lib, prog = nesting
    events, _, tracer = trace_command([prog, 1, TIMES, jumps], library=[str(lib)],
                                      functions=["cudaMemcpy"])
    exits = [e for e in events if e.phase == "exit"]
    assert len(exits) == TIMES and all(e.args["kind"] == "HostToHost" for e in exits)
    assert tracer.stats_at_end["too_deep"] == 0 and tracer.stats_at_end["lost"] == 0
    done = run_cli("-o", "/dev/null", "-p", lib, "--functions", "cudaMemcpy", "--", prog, 1,
                   TIMES, jumps)
    assert done.returncode == 0, done.stderr
    assert "lost" not in done.stderr


def test_calls_nested_too_deep_after_longjmps_are_still_counted(root, nesting):
    """Entries left by longjmp and calls really nested too deep on one stack: only the calls
    that returned without their entry are lost, each counted once."""
    lib, prog = nesting
    depth = record.TASK_DEPTH + 2
    events, _, tracer = trace_command([prog, depth, TIMES, 3], library=[str(lib)],
                                      functions=["cudaMemcpy"])
    exits = [e for e in events if e.phase == "exit" and e.args["kind"] == "HostToHost"]
    assert len(exits) + tracer.stats_at_end["too_deep"] == depth * TIMES
