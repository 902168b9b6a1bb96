"""How long the tracer takes to exit after the traced command ends, with nothing left to
write: `ebpf-cuda -o /dev/null -- CMD`, where CMD prints CLOCK_MONOTONIC as it exits; the
time from then to the tracer's exit as seen by its parent. Target: within 50 ms.

With --baseline DIR, the package of another checkout (e.g. `git worktree add DIR COMMIT`)
runs in the same rounds, alternating with this one: a change's effect side by side.

    python3 bench/exit.py [ROUNDS] [--baseline DIR]
"""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

END = [sys.executable, "-S", "-c",
       "import time; print(time.clock_gettime_ns(time.CLOCK_MONOTONIC), flush=True)"]
HERE = str(Path(__file__).resolve().parent.parent)


def one_round(tree: str = HERE) -> float:
    env = dict(os.environ, PYTHONPATH=tree)
    tracer = subprocess.Popen([sys.executable, "-m", "ebpf_cuda", "-o", os.devnull, "--"] + END,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=env, cwd=tree)
    ended_ns = int(tracer.stdout.readline())
    tracer.wait()
    return (time.clock_gettime_ns(time.CLOCK_MONOTONIC) - ended_ns) / 1e6


def rounds_of(trees: Dict[str, str], rounds: int) -> Dict[str, List[float]]:
    times: Dict[str, List[float]] = {name: [] for name in trees}
    for i in range(rounds):
        order = list(trees.items())
        for name, tree in order[i % len(order):] + order[:i % len(order)]:
            times[name].append(one_round(tree))
    return times


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", type=int, nargs="?", default=20)
    parser.add_argument("--baseline", metavar="DIR")
    args = parser.parse_args(argv)
    trees = {"this tree": HERE}
    if args.baseline:
        trees["baseline %s" % args.baseline] = str(Path(args.baseline).resolve())
    for name, times in rounds_of(trees, args.rounds).items():
        times.sort()
        print("%s: command end -> tracer exit, %d rounds: median %.1f ms, min %.1f, max %.1f "
              "(%s)" % (name, args.rounds, times[args.rounds // 2], times[0], times[-1],
                        sys.executable))


if __name__ == "__main__":
    main()
