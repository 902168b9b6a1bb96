"""Runs a workload untraced and under ebpf-cuda with several option sets; same-run ratios.

    sudo python3 bench/gpu/traced.py [--lib PATH ...] [--rounds 3] -- COMMAND [ARGS...]

The command prints `result name=<what> value=<figure>` lines (cuda_loop, torch_bench.py);
for each option set the median over all repetitions and rounds is reported, and its ratio to
the untraced figure. Option sets (`--sets`): untraced; default (-o /dev/null); -r; --all;
+rt-launch (the default rows named, so the runtime's launch functions are probed besides the
driver's); json; --summary and --save (when the CLI has them). `--lib` paths are passed to
the CLI as -p. `bare` and `bare-entry` (bench/gpu/bare.py) put counting probes where the
default set probes: what any tracer costs at least.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
from typing import Dict, List, Tuple

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
_RESULT = re.compile(r"result name=(\S+) value=([-0-9.eE+]+)")
_LOST = re.compile(r"ebpf-cuda: (\d+) events lost")


def cli_has(option: str) -> bool:
    done = subprocess.run([sys.executable, "-m", "ebpf_cuda", "--help"], capture_output=True,
                          text=True, cwd=REPO)
    return re.search(r"(^|\s)%s[\s,=]" % re.escape(option), done.stdout) is not None


def option_sets(save_path: str, wanted: str = "") -> Dict[str, List[str]]:
    """Option sets by label; `wanted` (comma-separated labels) picks some, untraced always."""
    sys.path.insert(0, REPO)
    from ebpf_cuda.spec import apis

    default_names = ",".join(api.name for api in apis.TABLE if api.default)
    sets = {"untraced": None, "default": ["-o", os.devnull], "-r": ["-r", "-o", os.devnull],
            "--all": ["--all", "-o", os.devnull],
            # the default rows named: the runtime's launch functions are probed too
            "+rt-launch": ["--functions", default_names, "-o", os.devnull],
            "json": ["--json", "-o", os.devnull],
            # the floor: a counter at each entry (and return) the default set probes
            "bare": ["bare"], "bare-entry": ["bare", "--entry-only"]}
    if cli_has("--summary"):
        sets["--summary"] = ["--summary"]
    if cli_has("--save"):
        sets["--save"] = ["--save", save_path]
    if wanted:
        labels = ["untraced"] + [w for w in wanted.split(",") if w in sets and w != "untraced"]
        sets = {label: sets[label] for label in labels}
    return sets  # type: ignore[return-value]


BARE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bare.py")


def run(command: List[str], options, libs: List[str]) -> Tuple[Dict[str, List[float]], int]:
    p_libs = sum((["-p", lib] for lib in libs), [])
    if options is None:
        argv = command
    elif options[:1] == ["bare"]:  # counters only, where the default set probes
        argv = [sys.executable, BARE, *p_libs, *options[1:], "--", *command]
    else:
        argv = [sys.executable, "-m", "ebpf_cuda", *p_libs, *options, "--", *command]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        print("  (%s exited %d: %s)" % (" ".join(options or ["untraced"]), done.returncode,
                                        done.stderr.strip()[-300:]))
    values: Dict[str, List[float]] = {}
    for name, value in _RESULT.findall(done.stdout):
        values.setdefault(name, []).append(float(value))
    lost = _LOST.search(done.stderr)
    return values, int(lost.group(1)) if lost else 0


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", action="append", default=[])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--save-path", default="/tmp/ebpf-cuda-bench-save.bin")
    parser.add_argument("--sets", default="untraced,default,-r,--all,--summary,--save",
                        help="option sets to run (labels: untraced, bare, bare-entry, default, -r, "
                             "--all, +rt-launch, json, --summary, --save)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    sets = option_sets(args.save_path, args.sets)
    results: Dict[str, Dict[str, List[float]]] = {k: {} for k in sets}
    lost: Dict[str, int] = {k: 0 for k in sets}
    for round_no in range(args.rounds):
        for label, options in sets.items():
            values, n_lost = run(command, options, args.lib)
            lost[label] += n_lost
            for name, vs in values.items():
                results[label].setdefault(name, []).extend(vs)
            print("round %d %-10s %s lost=%d" % (round_no + 1, label, " ".join(
                "%s=%.3f" % (n, statistics.median(v)) for n, v in values.items()), n_lost),
                flush=True)
    names = sorted({n for r in results.values() for n in r})
    print("\ncommand: %s" % " ".join(command))
    print("%-10s %s %s" % ("options", " ".join("%16s" % n for n in names), "  lost"))
    base = results["untraced"]
    for label in sets:
        cells = []
        for n in names:
            vs = results[label].get(n)
            if not vs:
                cells.append("%16s" % "-")
                continue
            med = statistics.median(vs)
            ratio = med / statistics.median(base[n]) if base.get(n) else float("nan")
            cells.append("%9.3f %5.2fx" % (med, ratio))
        print("%-10s %s %6d" % (label, " ".join(cells), lost[label]))


if __name__ == "__main__":
    main(sys.argv[1:])
