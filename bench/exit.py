"""How long the tracer takes to exit after the traced command ends, with nothing left to
write: `ebpf-cuda -o /dev/null -- CMD`, where CMD prints CLOCK_MONOTONIC as it exits; the
time from then to the tracer's exit as seen by its parent. Target: within 50 ms.

    python3 bench/exit.py [ROUNDS]
"""
import os
import subprocess
import sys
import time

END = [sys.executable, "-S", "-c",
       "import time; print(time.clock_gettime_ns(time.CLOCK_MONOTONIC), flush=True)"]


def one_round() -> float:
    tracer = subprocess.Popen([sys.executable, "-m", "ebpf_cuda", "-o", os.devnull, "--"] + END,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ended_ns = int(tracer.stdout.readline())
    tracer.wait()
    return (time.clock_gettime_ns(time.CLOCK_MONOTONIC) - ended_ns) / 1e6


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    times = sorted(one_round() for _ in range(rounds))
    print("command end -> tracer exit, %d rounds: median %.1f ms, min %.1f, max %.1f (%s)"
          % (rounds, times[rounds // 2], times[0], times[-1], sys.executable))


if __name__ == "__main__":
    main()
