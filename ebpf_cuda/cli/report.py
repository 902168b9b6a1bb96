"""`ebpf-cuda report FILE...`: the outputs of a trace saved with --save, or the NCCL
collectives of several ranks' traces merged. Needs no privileges; Python's own signals."""
import sys
from typing import Optional, Sequence, Tuple

import click

from ..errors import UsageError
from ..output import plan
from .common import check_split, print_report, say, stdout_closed_at_start


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", metavar="FILE...", nargs=-1, required=True)
@click.option("--collectives", is_flag=True,
              help="Merge the NCCL collectives of the ranks in the FILEs (the default with "
                   "several): ranks that never entered one, arrival spread, mismatches.")
@click.option("-t", "--no-timestamps", is_flag=True, help="Leave the time column out.")
@click.option("--json", "as_json", is_flag=True, help="JSON Lines, one object per event.")
@click.option("-o", "--output", metavar="FILE", help="Write events to FILE instead of stdout.")
@click.option("--summary", is_flag=True, help="Print the summary tables.")
@click.option("--by-device", is_flag=True, help="With --summary: the tables once per GPU.")
@click.option("--by-container", is_flag=True,
              help="With --summary: the tables once per container (known live only).")
@click.option("--leaks", is_flag=True, help="Flag double frees; list allocations never freed.")
@click.option("--trace-out", metavar="FILE.json", help="Write a Chrome trace timeline.")
@click.option("--report", "report_html", metavar="FILE.html", help="Write an HTML report.")
def report_cmd(paths: Tuple[str, ...], collectives: bool, no_timestamps: bool, as_json: bool,
               output: Optional[str], summary: bool, by_device: bool, by_container: bool,
               leaks: bool,
               trace_out: Optional[str], report_html: Optional[str]) -> None:
    """Outputs of a trace saved with --save: ebpf-cuda report FILE [OPTIONS]; with several
    FILEs (the ranks of one job), their NCCL collectives merged. Needs no privileges; kernel
    names are those known when tracing."""
    from ..output import savefile

    if collectives or len(paths) > 1:
        return _collectives_report(paths, [("-t", no_timestamps), ("--json", as_json),
                                           ("-o", output), ("--summary", summary),
                                           ("--leaks", leaks), ("--trace-out", trace_out),
                                           ("--report", report_html),
                                           ("--by-device", by_device),
                                           ("--by-container", by_container)])
    check_split(summary, by_device, by_container)
    path = paths[0]

    request = plan.Request(output, as_json, not no_timestamps, summary, leaks,
                           trace_out=trace_out, report_html=report_html,
                           stdout_closed=stdout_closed_at_start(), by_device=by_device,
                           by_container=by_container)
    plan.refuse_same_files(request.files(), [("the input trace", path)])
    saved = savefile.load(path)
    from ..monitor.flight import describe, read_trigger  # a flight-recorder dump names its trigger

    trigger = read_trigger(path)
    if trigger is not None:
        say("flight-recorder dump: %s; the %gs before it" % (describe(trigger),
                                                             trigger.get("window_s", 0)))
    made = plan.for_replay(request, saved, warn=say)
    outputs, losses, graphs = plan.replay(saved, made.sinks, notice=say)
    reports = made.reports()
    if reports and summary and losses.total:
        reports[0] += "\n\n" + plan.summary_losses(losses)
    printed = print_report("\n\n".join(reports), err=request.reports_to_stderr()) if reports \
        else True  # as live
    if graphs.unknown_summary():
        say(graphs.unknown_summary())
    incomplete = saved.incomplete()
    if incomplete:  # what is known to be missing, the noted losses with it
        say(incomplete)
    elif losses.sentence():  # the line the live run printed
        say(losses.sentence())
    if outputs.failures or not printed:
        sys.exit(1)


def _collectives_report(paths: Sequence[str], options: Sequence[Tuple[str, object]]) -> None:
    """`report FILE...`: the NCCL collectives of the ranks saved in the FILEs, merged (the
    logic: analysis/collectives.py)."""
    given = [name for name, value in options if value]
    if given:
        raise UsageError("%s: with several FILEs (or --collectives) report merges their NCCL "
                         "collectives; the other outputs take one FILE" % ", ".join(given))
    from ..analysis.collectives import merge_report
    from ..output.savefile import load

    if not print_report(merge_report(paths, [load(path) for path in paths])):
        sys.exit(1)
