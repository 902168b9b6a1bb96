"""`ebpf-cuda analyze FILE...`: the steps, wait bounds and findings of traces saved with
--save (several ranks' files: each analysed, its findings labelled with the file). Needs no
privileges; Python's own signals. The analysis itself is analysis/analyzer.py's."""
import sys
from typing import Optional, Tuple

import click

from .common import print_report, say


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", metavar="FILE...", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True,
              help="JSON Lines: a `steps` record per loop, a `graph_replays` record per "
                   "capture site, a `finding` record per finding.")
@click.option("--step-at", metavar="FUNCTION",
              help="Each call of this CUDA function, or each invocation of this Python "
                   "function (traces with --py-stacks) or native function (traces with "
                   "--stacks: `train_step` also names `train_step(int)`), starts a step.")
@click.option("--report", "report_html", metavar="FILE.html",
              help="Also write an HTML report with the analysis (one FILE only).")
def analyze_cmd(paths: Tuple[str, ...], as_json: bool, step_at: Optional[str],
                report_html: Optional[str]) -> None:
    """Steps, where the host waits on the GPU, and findings of saved traces:
    ebpf-cuda analyze FILE... [OPTIONS]"""
    from ..analysis.analyzer import Analyzer
    from ..errors import UsageError
    from ..output import plan, savefile

    if report_html and len(paths) > 1:
        raise UsageError("--report writes one trace's report: give one FILE")
    texts, failed = [], False
    for path in paths:
        if report_html:
            plan.refuse_same_files([("--report", report_html)], [("the input trace", path)])
        saved = savefile.load(path)
        analyzer = Analyzer(saved.namer, step_at, as_json=as_json,
                            label=path if len(paths) > 1 else None,
                            stacks=saved.stack_frames if saved.stacks else None)
        sinks = [analyzer]
        if report_html:
            request = plan.Request(report_html=report_html)
            html = plan.for_replay(request, saved, warn=say).sinks  # (the HTML writer)
            for sink in html:
                sink.analyzer = analyzer  # (its analysis section)
            sinks += html
        outputs, losses, _ = plan.replay(saved, sinks, notice=say)
        failed = failed or bool(outputs.failures)
        texts.append(analyzer.report())
        incomplete = saved.incomplete()
        if incomplete or losses.sentence():
            say("%s: %s (the analysis sees only the calls recorded)"
                % (path, incomplete or losses.sentence()))
    text = "\n".join(t for t in texts if t) if as_json else "\n\n".join(texts)
    if (text and not print_report(text)) or failed:
        sys.exit(1)
