"""The iterations of a program's loop, found without annotations.

Per thread, the calls that put work on the GPU or wait for it (launches by kernel, copies by
direction and size, memsets by size, graph launches by exec, synchronising calls by function)
form a sequence of tokens. A loop repeats a run of them. The search reads the work tokens
(how many times a thread waits can vary from step to step: PyTorch's allocator synchronises
the events of the blocks it frees). For each token seen at least MIN_STEPS times, the runs
between its consecutive occurrences are compared: a token that starts the loop's body
repeats the same run (allowing a share of deviating iterations, STEP_REGULAR_SHARE); its
occurrences in the set-up before the loop and after it are left out (EDGE_STEP_MIN_SHARE).
`_anchor` picks the step's start among them: not a token of a loop inside another's
iteration (a model's layers, a compiler's benchmark loop), a token of a loop that replays
CUDA graphs over one of the eager warm-up before it, then the most regular. The last step
ends after the tokens most steps have (what follows the loop is no step). Calls that are
no tokens (allocations, event records, queries) belong to the step whose first token
follows them, up to a capture (a graph captured before the loop is set-up). In a loop that
replays graphs, the steps before the first replay are its `warm-up` and `capture`; another
thread's loop that ended before those replays is their warm-up (`_warm_ups`).
No token repeating regularly: no steps (nothing is called an iteration by guess). A loop
whose body repeats one token only (the same kernel, nothing else) cannot be told from a
loop of one call; a token that comes once every k iterations, perfectly regular, can win
over one marking every iteration whose runs alternate (steps then span k iterations).

`step_at` names the start instead: a CUDA function (each call starts a step), a Python
function (with --py-stacks) or a native one (with --stacks: the calls that record a user
stack). Each new invocation of a Python or native function starts a step, seen as the first
call with a frame of it after calls without one, or whose line in it (native: return
offset) is before the previous call's: a function whose calls all come from one place is
one step. Native calls without a stack (launches) are no evidence either way: they belong
to the step they fall in. The last such step ends after the function's last call (native:
and the calls without a stack after it): what follows is no step.
"""
from bisect import bisect_left
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..spec.apis import Role
from .statistics import percentile
from .thresholds import EDGE_STEP_MIN_SHARE, MIN_STEPS, STEP_REGULAR_SHARE
from .timeline import Call

Token = Tuple[str, object]


def token(call: Call) -> Optional[Token]:
    """What a call is in the loop's pattern (None: no part of it)."""
    if call.failed or call.captured:
        return None
    if call.role == Role.LAUNCH:  # (by address: a name may be learned only later)
        return ("launch", call.func)
    if call.role == Role.GRAPH_LAUNCH:
        return ("graph", call.args.get("graphExec"))
    if call.role == Role.COPY:  # (by size too: a batch's copy is not a weight's upload)
        return ("copy", "%s of %d bytes" % (call.direction, call.bytes))
    if call.role == Role.MEMSET:
        return ("memset", "%s of %d bytes" % (call.api, call.bytes))
    if call.blocking:
        return ("sync", call.api)
    return None


@dataclass
class Step:
    """One iteration: its thread's calls [first, last] (indexes into the thread's list)."""

    number: int
    pid: int
    tid: int
    calls: List[Call]
    start_ns: int
    end_ns: int  # the next step's start; the last step: its last call's end
    tokens: Tuple[Token, ...] = ()
    phase: str = ""  # "warm-up" or "capture" before a loop's graph replays (_phases)

    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def blocked_ns(self) -> int:
        """Time the thread spent in calls that wait for the GPU."""
        return sum(c.duration_ns for c in self.calls if c.blocking)

    @property
    def launches(self) -> List[Call]:
        return [c for c in self.calls if c.role == Role.LAUNCH and c.is_work]

    @property
    def graph_launches(self) -> List[Call]:
        return [c for c in self.calls if c.role == Role.GRAPH_LAUNCH and c.is_work]

    @property
    def copies(self) -> List[Call]:
        return [c for c in self.calls if c.role == Role.COPY and not c.failed]

    @property
    def allocations(self) -> List[Call]:
        return [c for c in self.calls if c.role == Role.ALLOC and not c.failed]

    @property
    def frees(self) -> List[Call]:
        return [c for c in self.calls if c.role == Role.FREE and not c.failed]

    @property
    def captures(self) -> bool:
        """It recorded work into a graph (a stream capture)."""
        return any(c.captured and not c.failed for c in self.calls)

    @property
    def mode(self) -> str:
        """How its kernels ran: `graph` (graph launches only), `eager` (kernel launches only),
        `mixed`, `-` (neither); or its phase before a loop's replays: `warm-up` (eager steps
        before the first capture or replay), `capture` (the step that recorded the graph)."""
        if self.phase:
            return self.phase
        graphs, eager = bool(self.graph_launches), bool(self.launches)
        return "mixed" if graphs and eager else "graph" if graphs else "eager" if eager else "-"


@dataclass
class Loop:
    """The steps of one thread, with what found them."""

    pid: int
    tid: int
    steps: List[Step]
    how: str  # "repeating sequence starting at ..." or "--step-at ..."
    body: Tuple[Token, ...] = ()  # the common run of tokens of a step
    where: Optional[str] = None  # the loop's Python function and line range, when known
    frame: Optional[Tuple[str, str, int]] = None  # (file, function, depth): _loop_frame
    deviating: Dict[int, str] = field(default_factory=dict)  # step number → what differed

    def steady(self) -> List[Step]:
        """The steps after the first (which pays for first-time work: allocations the
        caching allocators keep, kernel loading, graph capture), and after the warm-up and
        capture steps of a loop that replays graphs."""
        return [s for s in self.steps[1:] if not s.phase]


_MOD = (1 << 61) - 1  # segments compared by a polynomial hash of their tokens (and length)
_BASE = 1_000_003


class _Runs:
    """The token sequence with prefix hashes: any run's hash in O(1)."""

    def __init__(self, tokens: Sequence[Token]) -> None:
        ids: Dict[Token, int] = {}
        self.prefix, self.power = [0], [1]
        self.positions: Dict[Token, List[int]] = {}
        for i, tok in enumerate(tokens):
            code = ids.setdefault(tok, len(ids) + 1)
            self.prefix.append((self.prefix[-1] * _BASE + code) % _MOD)
            self.power.append(self.power[-1] * _BASE % _MOD)
            self.positions.setdefault(tok, []).append(i)

    def key(self, a: int, b: int) -> Tuple[int, int]:
        """(hash, length) of tokens[a:b]."""
        return (self.prefix[b] - self.prefix[a] * self.power[b - a]) % _MOD, b - a

    def count_in(self, tok: Token, a: int, b: int) -> int:
        places = self.positions[tok]
        return bisect_left(places, b) - bisect_left(places, a)


class _Candidate(NamedTuple):
    """A token that may start the steps: its occurrences in the loop (`places`, indexes
    into the tokens), its common run [a, b), and how regular its runs are."""

    share: float  # of its runs in the loop, those that are the common run
    token: Token
    places: Tuple[int, ...]
    run: Tuple[int, int]

    def rank(self) -> tuple:
        """The most regular, then seen most often, then the longest run, the earliest."""
        return self.share, len(self.places), self.run[1] - self.run[0], -self.places[0]


def _candidate(runs: _Runs, tok: Token, count: int) -> Optional[_Candidate]:
    """`tok` as a candidate, or None: seen MIN_STEPS times in the loop, its runs mostly one
    run (STEP_REGULAR_SHARE). Its occurrences before the loop or after it are left out: the
    leading ones whose run has fewer tokens than EDGE_STEP_MIN_SHARE of the common run's (a
    first step has about a step's calls: more for its first-time work, or some fewer,
    gradients zeroed only once they exist), and a last one followed by as few. Its share
    counts the runs from its first common run to its last (a first step's first-time work,
    and a warm-up and capture before the replays, deviate without being irregular; a
    fallback among them is)."""
    places = runs.positions[tok]
    if len(places) < MIN_STEPS:
        return None
    keys = [runs.key(a, b) for a, b in zip(places, places[1:])]
    (common, length), times = Counter(keys).most_common(1)[0]
    if times < 2 or times < STEP_REGULAR_SHARE * len(keys):
        return None
    least = EDGE_STEP_MIN_SHARE * length
    first = next(i for i, key in enumerate(keys) if key[1] >= least)
    last = len(places)
    while last - 1 > first and count - places[last - 1] < least:
        last -= 1
    kept = places[first:last]
    inside = [i for i, key in enumerate(keys[first:last - 1]) if key == (common, length)]
    if len(kept) < MIN_STEPS or len(inside) < 2:
        return None
    start = kept[inside[0]]
    return _Candidate(len(inside) / (inside[-1] - inside[0] + 1), tok, tuple(kept),
                      (start, start + length))


def _anchor(tokens: Sequence[Token]) -> Optional[Tuple[_Candidate, Tuple[Token, ...]]]:
    """(the candidate whose occurrences start the steps, the common run) or None when
    nothing repeats.

    A candidate inside another's loop is dropped (`_inner`). When some candidates' runs
    replay a CUDA graph, only those remain: a loop of replays is the steady state, the
    eager loops before it its warm-up (and a compiler's benchmark loops). The best ranked
    wins (`_Candidate.rank`): a token that marks every iteration, also those that deviate
    (an eager fallback among graph replays), is more regular than one missing in them."""
    runs = _Runs(tokens)
    candidates = [c for c in (_candidate(runs, tok, len(tokens)) for tok in runs.positions)
                  if c is not None]
    outer = [c for c in candidates if not any(_inner(runs, c, other) for other in candidates
                                              if other is not c)]
    replaying = [c for c in outer if any(t[0] == "graph" for t in tokens[c.run[0]:c.run[1]])]
    outer = replaying or outer
    if not outer:
        return None
    chosen = max(outer, key=_Candidate.rank)
    return chosen, tuple(tokens[chosen.run[0]:chosen.run[1]])


def _inner(runs: _Runs, candidate: _Candidate, other: _Candidate) -> bool:
    """Whether `candidate` is a loop inside `other`'s steps: its token comes twice or more
    in other's common run (a nested loop), or all its occurrences lie between other's
    first and last and two or more in one of other's runs (a loop inside one iteration:
    a warm-up's, a benchmark's)."""
    if runs.count_in(candidate.token, *other.run) >= 2:
        return True
    mine, theirs = candidate.places, other.places
    if mine[0] < theirs[0] or mine[-1] > theirs[-1]:
        return False
    which = Counter(bisect_left(theirs, place) for place in mine)  # the run each lies in
    return max(which.values()) >= 2


def _invocation_starts(calls: Sequence[Call],
                       position: Callable[[Call], Optional[int]]) -> List[int]:
    """Indexes of the calls that begin a new invocation of a function: the first call made
    inside it (`position`: its line, or return offset, there; None outside it) after calls
    outside it, or made before the previous call's place in it. Calls `position` cannot tell
    (UNTOLD: no stack of that kind) are passed over."""
    starts: List[int] = []
    previous = None
    for call in calls:
        place = position(call)
        if place is UNTOLD:
            continue
        if place is not None and (previous is None or place < previous):
            starts.append(call.index)
        previous = place
    return starts


UNTOLD = -1  # (a position no frame has: lines and offsets are >= 0)


def _line_in(call: Call, function: str) -> Optional[int]:
    for frame in call.py_stack or ():
        if frame.function == function or frame.function.endswith("." + function):
            return frame.line if frame.line is not None else 0
    return None


def _offset_in(call: Call, function: str) -> Optional[int]:
    """A launch, with no user stack recorded, cannot tell (it falls in its step)."""
    if call.native_frames is None:
        return UNTOLD
    for frame in call.native_frames:
        if names(frame.function, function):  # type: ignore[arg-type]
            return frame.offset
    return None


def names(demangled: str, function: str) -> bool:
    """Whether `function` names the demangled name: itself, or it without its argument
    list (`train_step` for `train_step(int)`), or the last `::` part of that (`train_step`
    for `Model::train_step(int) const`)."""
    if demangled == function:
        return True
    bare = demangled
    close = demangled.rfind(")")
    if close >= 0:  # (the argument list: from the `(` that matches the last `)`)
        depth = 0
        for i in range(close, -1, -1):
            depth += {")": 1, "(": -1}.get(demangled[i], 0)
            if depth == 0:
                bare = demangled[:i]
                break
    return bare == function or bare.endswith("::" + function)


def _step_at(calls: Sequence[Call], step_at: str) -> Tuple[List[int], int]:
    """(the calls that start the steps `--step-at` names, where the last step ends: at the
    thread's end after a CUDA function's last call, else after the tokens most steps have)."""
    if any(c.api == step_at for c in calls):
        return [c.index for c in calls if c.api == step_at], len(calls)
    starts = (_invocation_starts(calls, lambda c: _line_in(c, step_at))
              or _invocation_starts(calls, lambda c: _offset_in(c, step_at)))
    if not starts:
        return [], len(calls)
    return starts, _last_end(calls, starts[-1], _usual(calls, starts))


def find_loop(calls: Sequence[Call], step_at: Optional[str] = None) -> Optional[Loop]:
    """The steps of one thread's calls (in time order, `index` their position), or None."""
    if not calls:
        return None
    body: Tuple[Token, ...] = ()
    end = None
    if step_at is not None:
        starts, end = _step_at(calls, step_at)
        how = "--step-at %s" % step_at
        if not starts:
            return None
    else:
        # (the search compares the work queued: how many times a thread waits can vary
        # from step to step, PyTorch's allocator synchronising its events when it frees)
        work = [(c.index, tok) for c in calls for tok in [token(c)]
                if tok is not None and tok[0] != "sync"]
        found = _anchor([tok for _, tok in work])
        if found is None:
            return None
        anchor, common = found
        starts = [work[place][0] for place in anchor.places]
        body = _usual(calls, starts)
        how = "a repeating sequence of %d calls, starting at %s" % (len(common),
                                                                     _show(anchor.token))
    loop = Loop(calls[0].pid, calls[0].tid, _cut(calls, starts, body, end), how, body)
    _phases(loop.steps)
    loop.frame = _loop_frame(loop.steps)  # (the first step's calls include the set-up's)
    steady = [c for step in (loop.steady() or loop.steps) for c in step.calls]
    loop.where = loop_lines(loop, steady) or native_region(steady)
    loop.deviating = _deviations(loop)
    return loop


def _usual(calls: Sequence[Call], starts: Sequence[int]) -> Tuple[Token, ...]:
    """The tokens (waits too) most steps have: those from one start to the next."""
    runs = Counter(tuple(tok for tok in map(token, calls[a:b]) if tok is not None)
                   for a, b in zip(starts, starts[1:]))
    return runs.most_common(1)[0][0] if runs else ()


def _show(tok: Token) -> str:
    kind, what = tok
    if kind == "graph":
        return "graph launch of exec 0x%x" % what if isinstance(what, int) else "graph launch"
    if kind == "launch":
        return "launch of 0x%x" % what if isinstance(what, int) else "launch"
    return "%s %s" % (kind, what)


def _cut(calls: Sequence[Call], starts: List[int], body: Tuple[Token, ...],
         last: Optional[int] = None) -> List[Step]:
    """The steps beginning at the calls `starts`, the last ending before call `last` (None:
    after the body's tokens); the calls between the previous step's last token and a
    step's first token go with that step."""
    steps: List[Step] = []
    for number, begin in enumerate(starts):
        end = starts[number + 1] if number + 1 < len(starts) else \
            _last_end(calls, begin, body) if last is None else max(last, begin + 1)
        lead = begin
        while lead > 0 and (number == 0 or lead - 1 >= starts[number - 1]) \
                and token(calls[lead - 1]) is None and not _capturing(calls[lead - 1]):
            lead -= 1
        own = list(calls[lead:end])
        steps.append(Step(number, calls[0].pid, calls[0].tid, own, own[0].start_ns, 0,
                          tuple(t for t in map(token, own) if t is not None)))
    for step, following in zip(steps, steps[1:]):
        step.calls = [c for c in step.calls if c.index < following.calls[0].index]
        step.tokens = tuple(t for t in map(token, step.calls) if t is not None)
        step.end_ns = following.start_ns
    if steps:
        steps[-1].end_ns = max(c.end_ns for c in steps[-1].calls)
    return steps


# What makes a graph: a step's leading calls stop before it (a capture made before the
# loop is set-up; one made inside an iteration belongs to it).
_CAPTURE_ROLES = (Role.CAPTURE_BEGIN, Role.CAPTURE_END, Role.INSTANTIATE)


def _capturing(call: Call) -> bool:
    return call.captured or call.role in _CAPTURE_ROLES


def _phases(steps: Sequence[Step]) -> None:
    """In a loop that replays graphs (torch.compile's cudagraph trees: a warm-up call, a
    recording call, then replays), the steps before the first that replays without
    capturing: those that captured are its `capture`, those that ran eagerly its
    `warm-up` (a loop without a capture or replay has neither)."""
    if not any(s.graph_launches or s.captures for s in steps):
        return
    for step in steps:
        if step.captures:
            step.phase = "capture"
        elif step.graph_launches:
            return
        elif step.launches:
            step.phase = "warm-up"


def _last_end(calls: Sequence[Call], begin: int, body: Tuple[Token, ...]) -> int:
    """Where the last step ends: after as many tokens as a step has (the calls after its
    loop are no step), or at the thread's end when the body is not known."""
    if not body:
        return len(calls)
    seen = 0
    for call in calls[begin:]:
        tok = token(call)
        if tok is not None:
            if tok != body[seen]:
                return call.index
            seen += 1
            if seen == len(body):
                return call.index + 1
    return len(calls)


def _loop_frame(steps: Sequence[Step]) -> Optional[Tuple[str, str, int]]:
    """(file, function, depth from the outermost frame) of the loop's Python frame: the
    outermost frame whose line differs between the steps' calls (None: no Python stacks, or
    the calls' stacks part before such a frame)."""
    stacks = [c.py_stack for s in steps for c in s.calls if c.py_stack]
    if not stacks:
        return None
    depth = min(len(s) for s in stacks)
    for back in range(1, depth + 1):  # from the outermost frame inwards
        frames = {s[-back] for s in stacks}
        if len({(f.file, f.function) for f in frames}) > 1:
            return None
        if len(frames) > 1:
            frame = next(iter(frames))
            return frame.file, frame.function, back
    # Every call from the same lines (a one-line loop body): the outermost function called
    # from the module's code, or the module's code itself.
    back = 2 if depth >= 2 and stacks[0][-1].function == "<module>" else 1
    return stacks[0][-back].file, stacks[0][-back].function, back


def loop_lines(loop: "Loop", calls: Sequence[Call]) -> Optional[str]:
    """`FILE:FIRST-LAST in FUNCTION`: the lines of the loop's function that made `calls`."""
    if loop.frame is None:
        return None
    file, function, back = loop.frame
    lines = sorted({c.py_stack[-back].line for c in calls  # type: ignore[index]
                    if c.py_stack and len(c.py_stack) >= back
                    and c.py_stack[-back].function == function
                    and c.py_stack[-back].line is not None})
    if not lines:
        return "%s in %s" % (file, function)
    span = "%d" % lines[0] if lines[0] == lines[-1] else "%d-%d" % (lines[0], lines[-1])
    return "%s:%s in %s" % (file, span, function)


def native_region(calls: Sequence[Call]) -> Optional[str]:
    """`FUNCTION+0xFIRST-0xLAST (FILE)`: the innermost native function all of `calls` that
    recorded a user stack were made in (the range: their return offsets in it); None when
    none recorded one, or their stacks share no function."""
    stacks = [c.native_frames for c in calls if c.native_frames]
    if not stacks:
        return None
    depth, shortest = 0, min(len(s) for s in stacks)
    while depth < shortest and len({(s[-1 - depth].function, s[-1 - depth].path)
                                    for s in stacks}) == 1:
        depth += 1  # (from the outermost frame inwards, while all share the function)
    if depth == 0:
        return None
    frames = [s[-depth] for s in stacks]
    offsets = sorted({f.offset for f in frames})
    span = "0x%x" % offsets[0] if len(offsets) == 1 else "0x%x-0x%x" % (offsets[0], offsets[-1])
    return "%s+%s (%s)" % (frames[0].function, span, os.path.basename(frames[0].path))


def _deviations(loop: Loop) -> Dict[int, str]:
    """The steps whose tokens differ from the common run, and the slow tail (wall time over
    SLOW_STEP_FACTOR × the median of the steady steps): what differed in each."""
    from .thresholds import SLOW_STEP_FACTOR

    steady = loop.steady()
    walls = sorted(s.wall_ns for s in steady)
    median = percentile(walls, 50) if walls else 0
    out: Dict[int, str] = {}
    for step in steady:
        notes = []
        if step.wall_ns > SLOW_STEP_FACTOR * median > 0:
            notes.append("%.1fx the median step time" % (step.wall_ns / median))
        if loop.body and step.tokens != loop.body and step is not loop.steps[-1]:
            notes.append(_difference(loop.body, step.tokens))
        if notes:
            out[step.number] = "; ".join(notes)
    return out


def _difference(body: Sequence[Token], tokens: Sequence[Token]) -> str:
    extra = Counter(tokens) - Counter(body)
    missing = Counter(body) - Counter(tokens)
    parts = ["+%d %s" % (n, _show(t)) for t, n in sorted(extra.items(), key=str)]
    parts += ["-%d %s" % (n, _show(t)) for t, n in sorted(missing.items(), key=str)]
    return "calls differ: " + ", ".join(parts) if parts else "calls in another order"


def find_loops(threads: Dict[Tuple[int, int], List[Call]],
               step_at: Optional[str] = None) -> Tuple[List[Loop], List[Loop]]:
    """(the loop of every thread that has one, those replaying graphs first, then the
    threads with most steps; the warm-up loops: `_warm_ups`)."""
    loops = [loop for calls in threads.values()
             for loop in [find_loop(calls, step_at)] if loop is not None]
    warm = _warm_ups(loops) if step_at is None else []
    loops = [loop for loop in loops if not any(loop is w for w in warm)]
    return sorted(loops, key=lambda lp: (not _replays(lp), -len(lp.steps), lp.pid,
                                         lp.tid)), warm


def _replays(loop: Loop) -> bool:
    return any(s.graph_launches for s in loop.steps)


def _warm_ups(loops: Sequence[Loop]) -> List[Loop]:
    """The loops of threads that ran only before another thread of their process began to
    replay graphs in a loop: what repeated there was the warm-up (PyTorch's autograd thread
    running the warm-up steps' backward passes, layer by layer), not steps."""
    first: Dict[int, int] = {}  # pid → when its first loop's first replay began
    for loop in loops:
        replays = [c.start_ns for s in loop.steps for c in s.graph_launches]
        if replays:
            first[loop.pid] = min(first.get(loop.pid, replays[0]), min(replays))
    return [loop for loop in loops if not _replays(loop) and loop.pid in first
            and loop.steps[-1].end_ns <= first[loop.pid]]
