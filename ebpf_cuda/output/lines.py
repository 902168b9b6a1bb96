"""Text and JSON lines straight from ring frames: the fast path of the default outputs.

Decoding every record into `Event`s and formatting each one costs several microseconds a call
in CPython, which is what made text and JSON lose events above ~50k calls/s. Here each row of
the table is compiled once into a %-template and the expressions that pick its values out of
an unpacked record (both per kind from values.py, which the decoder compiles too), so a
record becomes its line(s) with one tuple build and one format per line. Records that need more (calls that teach kernel names, values of rare kinds, failed
out-parameter reads) go through the decoder and the writer's own formatting, in order, so
the output is the same line for line (tests/test_lines.py checks this on every row).

A `detour` (graphs.GraphTracker, in the writer's DecodeContext) takes more records that
way: those of graph calls always (a graph launch's line shows the nodes it ran), and while
some stream captures, those of launches, copies, memsets and event calls (what a capture
records is marked `captured`). Only records on the slow path change whether a stream
captures, so the rows in use are chosen again after each of them.

Records of calls with a Python stack (--py-stacks: their PY_STACK field is not 0) take the
slow path too: the stack is the annotation's (pystacks.py sets `Event.py_stack` from the
record's key), and the writers show it (output/text.py, Event.to_json).
"""
from __future__ import annotations
import struct
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..decode.events import Decoder, Event
from ..decode.values import ARGS_AT as _ARGS_AT
from ..decode.values import NAMESPACE
from ..decode.values import OUTS_AT as _OUTS_AT
from ..decode.values import RET_AT as _RET_AT
from ..decode.values import SHAPES, Field, arg_fields, compile_tuple, out_fields
from ..spec import record
from ..spec.apis import Api, Kind, arg_cells
from ..spec.cuda_enums import error_name

if TYPE_CHECKING:
    from . import DecodeContext

_FRAME = struct.Struct("=8x" + record.LAYOUT.format.lstrip("<=@!>"))
_PY_STACK_AT = len(_FRAME.unpack(bytes(_FRAME.size))) - 1  # record.PY_STACK, the last field
_M32 = 0xFFFFFFFF
CHUNK_RECORDS = 1024  # records formatted and written at once: bounds the text held in memory


def frame_chunks(frames: bytes) -> List[memoryview]:
    """A batch of frames in views of at most CHUNK_RECORDS frames (no copies)."""
    view, step = memoryview(frames), CHUNK_RECORDS * record.FRAME_SIZE
    return [view[start:start + step] for start in range(0, len(frames), step)]


def _fields(api: Api) -> Optional[List[Field]]:
    """The fields of the shown arguments (values.py), or None if a kind has no templates."""
    return _compilable(arg_fields(api))


def _outs(api: Api) -> Optional[List[Field]]:
    return _compilable(out_fields(api))


def _compilable(fields: List[Field]) -> Optional[List[Field]]:
    ok = all(SHAPES[f.kind].json is not None for f in fields)  # (every kind has a text one)
    return fields if ok else None


# Every compiled line function takes the same arguments: the unpacked record `f`; the
# second's text and the ns into it of the entry (c0, u0) and exit (c1, u1) wall-clock times
# (text: HH:MM:SS; JSON: "S."); the thread's columns `h` and suffix `t`; the
# return's name `e`; and `fn`, the launch's kernel name (text: or its address in hex; JSON:
# the "kernel" member or ""); the duration's text `d` (text only: "%.1f" of the microseconds,
# kept per value, as float formatting is the costliest part of a line); `g`, the thread's
# columns without its device (JSON: the exit line of a call whose `device` out-parameter is
# that key, cudaGetDevice).
_PARAMS = "f, c0, u0, c1, u1, h, t, e, fn, d='', g=''"


def _compile(pieces: Sequence[Tuple[str, Sequence[str]]]) -> Callable[..., str]:
    """A function of _PARAMS formatting the (template, expressions) pieces with one `%`."""
    template = "".join(t for t, _ in pieces)
    exprs = [e for _, es in pieces for e in es]
    body = "%r %% (%s,)" % (template, ", ".join(exprs)) if exprs else repr(template)
    return eval("lambda %s: %s" % (_PARAMS, body), dict(NAMESPACE))


def _literal(text: str) -> Tuple[str, Sequence[str]]:
    return text.replace("%", "%%"), ()


class _Row:
    """A row compiled for one output: each attribute a function of _PARAMS giving the enter
    line, both lines of a call (successful or not), or the exit line alone."""

    def __init__(self, api: Api, func_at: Optional[int],
                 enter: List[Tuple[str, Sequence[str]]],
                 exit_ok: List[Tuple[str, Sequence[str]]],
                 exit_err: List[Tuple[str, Sequence[str]]]) -> None:
        self.api = api
        self.func_at = func_at
        self.enter = _compile(enter)
        self.both_ok = _compile(enter + [("\n", ())] + exit_ok)
        self.both_err = _compile(enter + [("\n", ())] + exit_err)
        self.exit_ok = _compile(exit_ok)
        self.exit_err = _compile(exit_err)
        self.ret_names: Dict[int, str] = {}
        # (cudaGetDevice, with a device tracker: the device its successful call tells, and
        # the index in the record of the cell it is read from)
        self.told_device: Optional[Callable[[tuple], Tuple[Any, ...]]] = None
        self.told_at: Optional[int] = None

    def ret_name(self, ret: int) -> str:
        name = self.ret_names.get(ret)
        if name is None:
            name = self.ret_names[ret] = error_name(ret, self.api.library)
        return name


def _func_at(api: Api) -> Optional[int]:
    for arg, cell in arg_cells(api):
        # (a graph kernel node's `func` is the first cell of its parameters)
        if (arg.name == "func" or arg.kind == Kind.KERNEL_NODE) and arg.show:
            return _ARGS_AT + cell
    return None


def _telling(row: _Row, api: Api) -> _Row:
    """The row of a call that tells its thread's device: how its `device` out-parameter is
    read, and the record's cell it lies in (out-parameter j: cell OUTS_AT + j)."""
    j = next(j for j, out in enumerate(api.outs) if out.name == "device")
    device = out_fields(api)[j]
    row.told_device, row.told_at = compile_tuple([device]), _OUTS_AT + j
    return row


_UNCOMPILED = object()


_NS = 1_000_000_000


def _clock(second: int) -> str:
    """HH:MM:SS of a wall-clock second."""
    return time.strftime("%H:%M:%S", time.localtime(second))


def _second(wall_ns: int) -> Tuple[int, int, str]:
    """The second of a wall-clock time in ns as [low, high) in ns, and its HH:MM:SS."""
    second = wall_ns // _NS
    return second * _NS, (second + 1) * _NS, _clock(second)


class _FrameLines:
    """Lines of a batch of frames; subclasses compile the rows (on first use) for their
    format and say how a record's per-thread and per-return values are written."""

    def __init__(self, table: Sequence[Api], decoder: Decoder,
                 slow: Callable[[List[Event]], List[str]], namer=None,
                 context: Optional["DecodeContext"] = None) -> None:
        self.decoder = decoder
        self.slow = slow  # the writer's own formatting, for records the rows do not cover
        self.namer = namer  # KernelNamer, FoundNames or None
        self.table = list(table)
        # indexed by a record's u16 function id: ids past the table take the slow path
        self._rows: List[Any] = [_UNCOMPILED] * len(self.table) + [None] * (
            (1 << 16) - len(self.table))
        self._threads: Dict[int, tuple] = {}  # tid -> its columns (_thread)
        self._durations: Dict[int, str] = {}
        # (the writer's DecodeContext)
        self.detour = context.detour if context else None  # see the module's docstring
        self.containers = context.containers if context else None  # who runs where
        self.devices = context.devices if context else None  # each thread's GPU
        self._devices_seen = -1  # its version the thread columns were made with
        self._capturing_rows: Optional[List[Any]] = None  # the rows while a stream captures

    @property
    def rows(self) -> List[Optional[_Row]]:
        """Every row compiled (None: its records take the slow path)."""
        return [self.row(i) for i in range(len(self.table))]

    def row(self, fn_id: int) -> Optional[_Row]:
        row = self._rows[fn_id]
        if row is _UNCOMPILED:
            api = self.table[fn_id]
            shown, outs = _fields(api), _outs(api)
            row = None
            tells = self.devices is not None and self.devices.only_tells(api)
            if shown is not None and outs is not None and not (
                    api.learn_name or api.learn_func or api.learn_alias) and not (
                    self.detour is not None and self.detour.always_needs(api)) and not (
                    self.devices is not None and self.devices.changes(api) and not tells):
                row = self._compile_row(api, shown, outs)
                if tells:
                    row = _telling(row, api)
            self._rows[fn_id] = row
            capturing = self._capturing_rows
            if capturing is not None and capturing[fn_id] is _UNCOMPILED:
                capturing[fn_id] = row
        return row

    def _rows_now(self) -> List[Any]:
        """The rows by function id: while a stream captures (see `detour`), those of the
        calls a capture records take the slow path."""
        detour = self.detour
        if detour is None or not detour.capturing:
            return self._rows
        if self._capturing_rows is None:
            self._capturing_rows = [None if fn_id < len(self.table)
                                    and detour.needs_while_capturing(self.table[fn_id])
                                    else row for fn_id, row in enumerate(self._rows)]
        return self._capturing_rows

    def _compile_row(self, api: Api, shown, outs) -> _Row:
        raise NotImplementedError

    def _who(self, comm: bytes, pid: int, tid: int) -> Tuple[str, str, str]:
        """The thread's columns, its suffix, and its columns without the device."""
        raise NotImplementedError

    def kernel_name(self, row: _Row, pid: int, func: int,
                    when: Optional[int] = None) -> Optional[str]:
        """The launch's kernel name, if the namer knows it (`when`: the record's kernel time,
        which tells the program of a process that exec'd, see names.py)."""
        if self.namer is None:
            return None
        return self.namer.name_for(pid, row.api.name, func, when)

    # How a subclass writes a second ([low, high) in ns and its text: see _second) and
    # whether its exit lines carry the duration text
    second_of = staticmethod(_second)
    timed = True

    def lines(self, frames: bytes) -> List[str]:
        """The lines of a batch (no newlines between records), in record order."""
        out: List[str] = []
        rows, compiled, threads, durations = (self._rows_now(), self.row, self._threads,
                                              self._durations)
        second_of, timed = self.second_of, self.timed
        offset = self.decoder.clock_offset_ns
        odd_flags = record.FLAG_OUT0_FAULT | record.FLAG_OUT1_FAULT
        call, enter, entry_sent = record.PHASE_CALL, record.PHASE_ENTER, record.FLAG_ENTRY_SENT
        add, ret_at, m32, py_at = out.append, _RET_AT, _M32, _PY_STACK_AT
        # The second the clock text shows, [low, high) in wall-clock ns, kept while it lasts:
        # the times are ints (exact, and no float arithmetic a record)
        low, high, clock = 0, 0, ""
        self._devices_now()
        for f in _FRAME.iter_unpack(frames):
            row = rows[f[4]]
            if row is _UNCOMPILED:
                row = compiled(f[4])
            flags, phase = f[6], f[5]
            # (a call with a Python stack: its lines show it once annotated, see above)
            if row is None or flags & odd_flags or phase > call or f[py_at]:
                out += self.slow(self.decoder.events_of(f))
                rows = self._rows_now()  # (a capture may have begun or ended)
                self._devices_now()  # (a thread may be on another device)
                continue
            who = threads.get(f[2])  # (by tid, its comm compared: see _thread)
            if who is None or who[3] != f[8]:
                who = self._thread(f)
            fn = "" if row.func_at is None else self.launch_text(row, f)
            w0 = f[0] + offset
            if phase == enter:
                if not low <= w0 < high:
                    low, high, clock = second_of(w0)
                add(row.enter(f, clock, w0 - low, "", 0, who[0], who[1], "", fn))
                continue
            w1 = f[1] + offset
            if not low <= w1 < high:
                low, high, clock = second_of(w1)
            ret = f[ret_at] & m32
            if ret:
                line = row.exit_err if flags & entry_sent else row.both_err
                e = self.ret_text(row, ret)
            else:
                line, e = row.exit_ok if flags & entry_sent else row.both_ok, ""
            d = "" if not timed else durations.get(f[1] - f[0]) or self._duration(f[1] - f[0])
            if low <= w0 < high:
                add(line(f, clock, w0 - low, clock, w1 - low, who[0], who[1], e, fn, d, who[2]))
            else:  # (entered in an earlier second)
                add(line(f, second_of(w0)[2], w0 % _NS, clock, w1 - low, who[0], who[1], e,
                         fn, d, who[2]))
            at = row.told_at
            if at is not None and not ret and f[at] != who[4]:
                self._told(row, f, who)
        return out

    def _told(self, row: _Row, f: tuple, who: tuple) -> None:
        """Hand the device a cudaGetDevice call told to the device tracker. The thread's
        columns keep the cell it was read from when that was no news: while they are kept
        (`version` unchanged), the same cell tells the tracker nothing new again."""
        if self.devices.told(f[3], f[2], row.told_device(f)[0]):
            self._devices_now()
        else:
            self._threads[f[2]] = who[:4] + (f[row.told_at],)

    def _devices_now(self) -> None:
        """The thread columns are made again once a thread's device may have changed."""
        devices = self.devices
        if devices is not None and devices.version != self._devices_seen:
            self._devices_seen = devices.version
            self._threads.clear()

    def _thread(self, f: tuple) -> tuple:
        """The columns of a record's thread, kept by tid with its comm (a thread's pid
        never changes, its name can): (columns, suffix, columns without the device, comm,
        the device it last told, see `_told`)."""
        if len(self._threads) > 1024:  # (bounded: a system-wide trace sees many threads)
            self._threads.clear()
        who = self._threads[f[2]] = self._who(f[8], f[3], f[2]) + (f[8], None)
        return who

    def _duration(self, ns: int) -> str:
        """A duration in microseconds as text lines show it, kept (values repeat a lot)."""
        if len(self._durations) > 8192:  # (bounded: ~0.5 MB; short calls repeat most)
            self._durations.clear()
        text = self._durations[ns] = "%.1f" % (ns / 1000.0)
        return text

    def launch_text(self, row: _Row, f: tuple) -> str:
        raise NotImplementedError

    def ret_text(self, row: _Row, ret: int) -> str:
        return row.ret_name(ret)


class TextLines(_FrameLines):
    """The seed tool's text lines (see output/text.py), from frames."""

    def __init__(self, table: Sequence[Api], decoder: Decoder,
                 slow: Callable[[List[Event]], List[str]], namer=None,
                 timestamps: bool = True, context: Optional["DecodeContext"] = None) -> None:
        super().__init__(table, decoder, slow, namer, context)
        self.timestamps = timestamps

    def _clock_piece(self, which: int) -> Tuple[str, Sequence[str]]:
        if not self.timestamps:
            return "", ()
        return "%s.%06d ", ("c%d" % which, "u%d // 1000" % which)  # (u: ns into the second)

    def _compile_row(self, api: Api, shown, outs) -> _Row:
        func_at = _func_at(api)
        args = []
        for f in shown:
            if f.name == "func" and self.namer is not None:
                args.append(("func=%s", ("fn",)))  # the kernel name or the address
            else:
                args.append(("%s=%s" % (f.name, SHAPES[f.kind].text), f.parts))
        enter = [self._clock_piece(0), ("%s", ("h",)),
                 _literal("%-20s %8s " % (api.name, "[ENTER]"))]
        for k, piece in enumerate(args):
            enter += [(" " if k else "", ()), piece]
        enter.append(("%s", ("t",)))
        exit_head = [self._clock_piece(1), ("%s", ("h",)),
                     _literal("%-20s %8s returned=" % (api.name, "[EXIT]"))]
        duration = (" (%s us)%s", ("d", "t"))
        exit_ok = exit_head + [_literal(error_name(0, api.library))]
        for f in outs:
            exit_ok.append((" %s=%s" % (f.name, SHAPES[f.kind].text), f.parts))
        return _Row(api, func_at, enter, exit_ok + [duration],
                    exit_head + [("%s", ("e",)), duration])

    def _who(self, comm: bytes, pid: int, tid: int) -> Tuple[str, str, str]:
        container = self.containers.shown(pid) if self.containers is not None else None
        columns = "%-16s %-7d " % (self.decoder.comm(comm), pid)
        return (columns, ("" if tid == pid else " tid=%d" % tid)
                + (" container=%s" % container if container else ""), columns)

    def launch_text(self, row: _Row, f: tuple) -> str:
        func = f[row.func_at]
        return self.kernel_name(row, f[3], func, f[0]) or "0x%x" % func


def _json_encoder() -> Callable[[str], str]:
    """json's string encoder, ensure_ascii as JsonWriter (json imported by the JSON lines
    alone: text lines do not need it, and it is 2-3 ms of the start)."""
    import json

    return json.JSONEncoder().encode


def _second_ns(wall_ns: int) -> Tuple[int, int, str]:
    """The second of a wall-clock time in ns, [low, high), and its text "S." in JSON."""
    second = wall_ns // _NS
    return second * _NS, (second + 1) * _NS, "%d." % second


class JsonLines(_FrameLines):
    """JSON Lines objects (see output/jsonl.py and Event.to_json), from frames."""

    def __init__(self, table: Sequence[Api], decoder: Decoder,
                 slow: Callable[[List[Event]], List[str]], namer=None,
                 context: Optional["DecodeContext"] = None) -> None:
        self._json_str = _json_encoder()
        super().__init__(table, decoder, slow, namer, context)
        self._members: Dict[str, str] = {}

    def _compile_row(self, api: Api, shown, outs) -> _Row:
        args = ",".join('"%s":%s' % (f.name, SHAPES[f.kind].json) for f in shown)
        arg_values = [e for f in shown for e in f.parts]

        # (an exit whose `device` out-parameter is the event's device key: the columns
        # without the thread's device, `g`, as Event.to_json leaves it out)
        told = self.devices is not None and self.devices.only_tells(api)

        def head(which: int, columns: str = "h") -> List[Tuple[str, Sequence[str]]]:
            # (the time exact to the ns: the second's "S." and the ns into it, see lines())
            return [('{"ts":%s%09d', ("c%d" % which, "u%d" % which)), ("%s", (columns,)),
                    _literal(',"api":"%s","phase":"%s",' % (api.name, ("enter", "exit")[which])),
                    ('"args":{' + args + "}", arg_values)]

        def exit_head(ret_name: Tuple[str, Sequence[str]], columns: str = "h"
                      ) -> List[Tuple[str, Sequence[str]]]:
            # (a success's lines are formatted only for a return value of 0: written so)
            ret = (_literal(',"ret":0,"ret_name":') if ret_name is success
                   else (',"ret":%d,"ret_name":', ("f[%d] & 0xFFFFFFFF" % _RET_AT,)))
            return head(1, columns) + [ret, ret_name, (',"duration_ns":%d', ("f[1] - f[0]",))]

        success = _literal(self._json_str(error_name(0, api.library)))
        outs_piece = ("".join(',"%s":%s' % (f.name, SHAPES[f.kind].json) for f in outs),
                      [e for f in outs for e in f.parts])
        tail = ("%s}", ("fn",))
        return _Row(api, _func_at(api), head(0) + [tail],
                    exit_head(success, "g" if told else "h") + [outs_piece, tail],
                    exit_head(("%s", ("e",))) + [tail])

    # The times as the JSON writes them: c0/c1 the second's text "S." and u0/u1 the ns into
    # it, from the wall-clock ns (ints: no float to repr, the costliest part of a line); no
    # duration text (the line has duration_ns)
    second_of = staticmethod(_second_ns)
    timed = False

    def _who(self, comm: bytes, pid: int, tid: int) -> Tuple[str, str, str]:
        container = self.containers.of(pid) if self.containers is not None else None
        device = self.devices.current(pid, tid) if self.devices is not None else None
        quote = self._json_str
        columns = (',"pid":%d,"tid":%d,"comm":%s' % (pid, tid, quote(self.decoder.comm(comm)))
                   + (',"container":%s' % quote(container) if container else ""))
        return (columns + (',"device":%d' % device if device is not None else ""), "", columns)

    def launch_text(self, row: _Row, f: tuple) -> str:
        if self.namer is None:
            return ""
        name = self.kernel_name(row, f[3], f[row.func_at], f[0])
        if not name:
            return ""
        member = self._members.get(name)  # demangled names are long: encode each once
        if member is None:
            if len(self._members) > 4096:
                self._members.clear()
            member = self._members[name] = ',"kernel":' + self._json_str(name)
        return member

    def ret_text(self, row: _Row, ret: int) -> str:
        return self._json_str(row.ret_name(ret))

