"""What `ebpf-cuda analyze` reports: a `Finding` (a rule's id, a severity, the evidence in
numbers, where, one sentence on what to change), and the `Context` every rule reads (the
calls, the loops, the wait bounds, the graph captures)."""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..spec.apis import Role
from .statistics import percentile
from .steps import Loop, Step
from .timeline import Call, Timeline
from .waits import Waits

HIGH, MEDIUM, LOW = "high", "medium", "low"


@dataclass
class Finding:
    rule: str
    severity: str
    title: str
    evidence: Dict[str, Any]  # numbers: calls, ns, bytes, shares, steps
    where: Dict[str, Any]  # python (FILE:LINE FUNCTION), api, kernels, stream, thread, pid
    advice: str
    summary: str = ""  # the evidence in one line of text

    def to_json(self) -> Dict[str, Any]:
        return {"type": "finding", "rule": self.rule, "severity": self.severity,
                "title": self.title, "evidence": self.evidence, "where": self.where,
                "advice": self.advice}

    def text(self) -> str:
        where = ", ".join("%s %s" % (k, _show(v, k == "stream")) for k, v in self.where.items()
                          if v not in (None, [], ""))
        return "[%s] %s: %s\n   %s\n   where: %s\n   change: %s" % (
            self.severity, self.rule, self.title, self.summary, where, self.advice)


def _show(value: Any, handle: bool = False) -> str:
    if isinstance(value, (list, tuple)):
        return "[%s]" % ", ".join(_show(v, handle) for v in value)
    if isinstance(value, int) and not isinstance(value, bool) and (handle or value > 0xFFFF):
        return "0x%x" % value if value else "0 (legacy default)"
    return str(value)


@dataclass
class Context:
    """What the rules read: every call, each thread's loop, the wait bounds, and which
    Python line captured each graph exec."""

    timeline: Timeline
    loops: List[Loop]
    waits: Waits
    captures: Dict[Tuple[int, Any], str] = field(default_factory=dict)  # (pid, exec) → site
    warm_ups: List[Loop] = field(default_factory=list)  # loops before graph replays: no steps

    @property
    def calls(self) -> List[Call]:
        return self.timeline.calls


def per_step(steps: Sequence[Step], value) -> List[float]:
    return sorted(float(value(s)) for s in steps)


def median(values: Sequence[float]) -> float:
    return percentile(sorted(values), 50)


def capture_sites(calls: Sequence[Call]) -> Dict[Tuple[int, Any], str]:
    """(pid, graph exec) → the site (Python line, else native caller) of the stream capture
    it was made from: the capture's begin."""
    began: Dict[Tuple[int, Any], str] = {}  # (pid, stream) → site of the begin
    graphs: Dict[Tuple[int, Any], str] = {}
    execs: Dict[Tuple[int, Any], str] = {}
    for call in calls:
        if call.failed:
            continue
        if call.role == Role.CAPTURE_BEGIN:
            began[(call.pid, call.args.get("stream"))] = call.site
        elif call.role == Role.CAPTURE_END:
            site = began.pop((call.pid, call.args.get("stream")), None)
            if site is not None:
                graphs[(call.pid, call.outs.get("graph"))] = site
        elif call.role == Role.INSTANTIATE:
            site = graphs.get((call.pid, call.args.get("graph")))
            if site is not None:
                execs[(call.pid, call.outs.get("graphExec"))] = site
    return execs


def region(calls: Sequence[Call]) -> Optional[str]:
    """`FILE:FIRST-LAST` of the innermost user frame shared by calls (the code that made
    them), else None (no Python stacks)."""
    from .python_lines import user_frame

    frames = [user_frame(c.py_stack) for c in calls if c.py_stack]
    if not frames:
        return None
    files = {(f.file, f.function) for f in frames}
    if len(files) != 1:
        return ", ".join(sorted("%s (%s)" % pair for pair in files)[:4])
    lines = sorted(f.line for f in frames if f.line is not None)
    file, function = files.pop()
    if not lines:
        return "%s in %s" % (file, function)
    return "%s:%d-%d in %s" % (file, lines[0], lines[-1], function) if lines[0] != lines[-1] \
        else "%s:%d in %s" % (file, lines[0], function)


def thread_of(loop: Loop) -> str:
    return "%d/%d" % (loop.pid, loop.tid)


def user_site(finding: Finding) -> Optional[str]:
    """The finding's Python place when it is in the user's code, else its native caller
    (None: neither, or only library frames, as on PyTorch's autograd thread)."""
    from .python_lines import is_user_file

    python = finding.where.get("python")
    if not isinstance(python, str) or not python:
        native = finding.where.get("native")  # (--stacks: the native caller's function)
        return native if isinstance(native, str) and native else None
    return python if is_user_file(python.split(":")[0].split(" ")[0]) else None


def merge_threads(findings: Sequence[Finding], summed: Sequence[str]) -> List[Finding]:
    """One finding per (process, user site) of a rule's findings: the threads of one loop
    (PyTorch's Python thread and its autograd thread, both allocating in every step) show
    one problem. A finding with no user site joins its process's one finding with a site
    when there is exactly one. The merged evidence adds up `summed`, names every thread
    (`threads`) and keeps each thread's own (`by_thread`)."""
    groups: Dict[Tuple[Any, Optional[str]], List[Finding]] = {}
    for finding in findings:
        groups.setdefault((_pid(finding), user_site(finding)), []).append(finding)
    for (pid, site), group in list(groups.items()):
        if site is None:
            sited = [key for key in groups if key[0] == pid and key[1] is not None]
            if len(sited) == 1:
                groups[sited[0]] += groups.pop((pid, site))
    return [_merged(group, summed) for group in groups.values()]


def _pid(finding: Finding) -> Any:
    thread = finding.where.get("thread")
    return thread.split("/")[0] if isinstance(thread, str) else None


def _merged(group: List[Finding], summed: Sequence[str]) -> Finding:
    if len(group) == 1:
        return group[0]
    first = group[0]
    threads = [f.where.get("thread") for f in group]
    evidence = dict(first.evidence)
    for key in summed:
        if all(isinstance(f.evidence.get(key), (int, float)) for f in group):
            evidence[key] = sum(f.evidence[key] for f in group)
    evidence["threads"] = threads
    evidence["by_thread"] = {str(f.where.get("thread")): f.evidence for f in group}
    where = dict(first.where, thread=threads)
    for key, value in first.where.items():
        if isinstance(value, list) and key != "thread":
            where[key] = sorted({v for f in group for v in f.where.get(key) or ()}, key=str)
    summary = "; ".join("thread %s: %s" % (f.where.get("thread"), f.summary) for f in group)
    return Finding(first.rule, first.severity, first.title, evidence, where, first.advice,
                   summary)
