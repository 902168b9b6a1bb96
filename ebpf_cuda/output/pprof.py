"""pprof profiles (`--pprof-out FILE`): a gzipped `profile.proto`, encoded by hand.

Sample types: calls (count), api_time (nanoseconds), launches (count), alloc_space and
copy_space (bytes). Each sample's stack is, leaf first: the kernel (launches), the CUDA
function, then the caller's native frames where the trace has them (`--stacks`: the memory
calls) and its Python frames (`--py-stacks`: function, file and line), so `go tool pprof`, Pyroscope or Parca show which code paths call CUDA, how often,
for how long, and what they allocate and copy. Samples carry `pid` and `comm` labels.

    with open("cuda.pb.gz", "wb") as f:
        sink = PprofWriter(f, stack=tracer.stack, resolver=tracer.names.resolver)
        ... sink.write(events) ...; sink.close()

`profile_of_monitor` makes one from the monitor's in-kernel counts (no stacks there: the
kernel keeps no stack per call when it only counts).

The encoding (developers.google.com/protocol-buffers/docs/encoding, and pprof's
proto/profile.proto): each field is a varint key (field number << 3 | wire type) then a
varint (type 0) or a varint length and that many bytes (type 2: strings, messages, packed
repeated numbers).
"""
import gzip
import os
import time
from typing import BinaryIO, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..decode.events import ENTER, EXIT, Event
from ..spec.apis import BY_NAME, Role

SAMPLE_TYPES = (("calls", "count"), ("api_time", "nanoseconds"), ("launches", "count"),
                ("alloc_space", "bytes"), ("copy_space", "bytes"))
CALLS, TIME, LAUNCHES, ALLOC, COPY = range(5)
DEFAULT_SAMPLE_TYPE = "api_time"

# profile.proto field numbers
_P_SAMPLE_TYPE, _P_SAMPLE, _P_LOCATION, _P_FUNCTION, _P_STRINGS = 1, 2, 4, 5, 6
_P_TIME, _P_DURATION, _P_PERIOD_TYPE, _P_PERIOD, _P_DEFAULT_TYPE = 9, 10, 11, 12, 14
_VT_TYPE, _VT_UNIT = 1, 2
_S_LOCATION, _S_VALUE, _S_LABEL = 1, 2, 3
_L_KEY, _L_STR, _L_NUM = 1, 2, 3
_LOC_ID, _LOC_ADDRESS, _LOC_LINE = 1, 3, 4
_LINE_FUNCTION, _LINE_LINE = 1, 2
_F_ID, _F_NAME, _F_SYSTEM_NAME, _F_FILENAME = 1, 2, 3, 4


# -- the wire format -------------------------------------------------------------------------

def varint(value: int) -> bytes:
    """A base-128 varint; negative numbers as their 64-bit two's complement."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def number_field(field: int, value: int) -> bytes:
    return varint(field << 3) + varint(value) if value else b""


def bytes_field(field: int, data: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(data)) + data


def packed_field(field: int, values: Iterable[int]) -> bytes:
    data = b"".join(varint(v) for v in values)
    return bytes_field(field, data) if data else b""


# -- building a profile ----------------------------------------------------------------------

Frame = Tuple  # (function name, file) or, for a Python frame, (function, file, line)
Labels = Tuple[Tuple[str, object], ...]  # (key, str or int)


class Profile:
    """Samples summed by (stack, labels); `encode()` gives the gzipped profile.proto."""

    def __init__(self, sample_types: Sequence[Tuple[str, str]] = SAMPLE_TYPES,
                 default_type: str = DEFAULT_SAMPLE_TYPE) -> None:
        self.sample_types = list(sample_types)
        self.default_type = default_type
        self.samples: Dict[Tuple[Tuple[Frame, ...], Labels], List[int]] = {}

    def add(self, stack: Sequence[Frame], values: Sequence[int], labels: Labels = ()) -> None:
        """Add `values` (one per sample type) to the sample of `stack` (leaf first)."""
        key = (tuple(stack), tuple(labels))
        have = self.samples.get(key)
        if have is None:
            self.samples[key] = list(values)
        else:
            for i, v in enumerate(values):
                have[i] += v

    def total(self, index: int) -> int:
        return sum(values[index] for values in self.samples.values())

    def encode(self, time_ns: Optional[int] = None, duration_ns: int = 0) -> bytes:
        strings: Dict[str, int] = {"": 0}

        def s(text: str) -> int:
            return strings.setdefault(text, len(strings))

        functions: Dict[Tuple[str, str], int] = {}
        locations: Dict[Frame, int] = {}
        body = [bytes_field(_P_SAMPLE_TYPE, number_field(_VT_TYPE, s(kind))
                            + number_field(_VT_UNIT, s(unit)))
                for kind, unit in self.sample_types]
        for (stack, labels), values in self.samples.items():
            for frame in stack:
                functions.setdefault(frame[:2], len(functions) + 1)
            ids = [locations.setdefault(frame, len(locations) + 1) for frame in stack]
            sample = packed_field(_S_LOCATION, ids) + packed_field(_S_VALUE, values)
            for key, value in labels:
                label = number_field(_L_KEY, s(key)) + (
                    number_field(_L_NUM, value) if isinstance(value, int)
                    else number_field(_L_STR, s(str(value))))
                sample += bytes_field(_S_LABEL, label)
            body.append(bytes_field(_P_SAMPLE, sample))
        # One location per frame (a function, and a line for Python frames): frames are
        # symbolized already.
        for (name, path), fid in functions.items():
            body.append(bytes_field(_P_FUNCTION, number_field(_F_ID, fid)
                                    + number_field(_F_NAME, s(name))
                                    + number_field(_F_SYSTEM_NAME, s(name))
                                    + number_field(_F_FILENAME, s(path))))
        for frame, lid in locations.items():
            line = number_field(_LINE_FUNCTION, functions[frame[:2]])
            if len(frame) > 2 and frame[2]:
                line += number_field(_LINE_LINE, frame[2])
            body.append(bytes_field(_P_LOCATION, number_field(_LOC_ID, lid)
                                    + bytes_field(_LOC_LINE, line)))
        calls = s("calls")
        count = s("count")
        default = s(self.default_type)
        body += [number_field(_P_TIME, time.time_ns() if time_ns is None else time_ns),
                 number_field(_P_DURATION, duration_ns),
                 bytes_field(_P_PERIOD_TYPE, number_field(_VT_TYPE, calls)
                             + number_field(_VT_UNIT, count)),
                 number_field(_P_PERIOD, 1), number_field(_P_DEFAULT_TYPE, default)]
        for text in sorted(strings, key=strings.__getitem__):
            body.append(bytes_field(_P_STRINGS, text.encode("utf-8")))
        return gzip.compress(b"".join(body))


# -- from events (ordinary traces) -----------------------------------------------------------

StackOf = Callable[[int], List[int]]  # stack id -> return addresses, innermost first


class PprofWriter:
    """A sink: every call of the trace, by process, function, kernel and (with --stacks)
    caller stack; written at `close()` (while the tracer is open: stacks are read then).
    `calls_at_entry`: a trace without return probes counts its enter events."""

    def __init__(self, stream: BinaryIO, stack: Optional[StackOf] = None, resolver=None,
                 namer=None, calls_at_entry: bool = False) -> None:
        self.stream = stream
        self.stack = stack
        self.resolver = resolver
        self.namer = namer
        self.phase = ENTER if calls_at_entry else EXIT
        self.started_ns: Optional[int] = None
        self.last_ns = 0
        # (pid, comm, api, kernel, stack id, Python stack) -> values
        self._calls: Dict[tuple, List[int]] = {}

    def header(self) -> None:
        """Nothing before the end."""

    def write(self, events: Iterable[Event]) -> None:
        for event in events:
            if event.phase != self.phase:
                continue
            api = BY_NAME.get(event.api)
            if api is None:
                continue
            if self.started_ns is None:
                self.started_ns = event.ts_ns
            self.last_ns = event.ts_ns
            ok = event.ret == 0
            kernel = None
            values = [1, event.duration_ns or 0, 0, 0, 0]
            if api.role == Role.LAUNCH and ok:
                values[LAUNCHES] = 1
                func = event.args.get("func")
                kernel = self.namer(event, func) if self.namer and func is not None else None
            elif api.role in (Role.ALLOC, Role.COPY) and ok:
                nbytes = _bytes(api, event)
                values[ALLOC if api.role == Role.ALLOC else COPY] = nbytes
            key = (event.pid, event.comm, event.api, kernel, event.stack_id, event.py_stack)
            have = self._calls.get(key)
            if have is None:
                self._calls[key] = values
            else:
                for i, v in enumerate(values):
                    have[i] += v

    def profile(self) -> Profile:
        profile = Profile()
        stacks: Dict[Tuple[int, int], List[Frame]] = {}
        for (pid, comm, api, kernel, stack_id, py_stack), values in self._calls.items():
            frames: List[Frame] = [] if kernel is None else [(kernel, "[kernel]")]
            frames.append((api, "[%s]" % BY_NAME[api].library))
            if stack_id and self.stack is not None:
                if (pid, stack_id) not in stacks:
                    stacks[(pid, stack_id)] = self._callers(pid, self.stack(stack_id))
                frames += stacks[(pid, stack_id)]
            # (--py-stacks: the Python frames, innermost first, below the native ones)
            frames += [(f.function, f.file, f.line or 0) for f in py_stack or ()]
            profile.add(frames, values, (("pid", pid), ("comm", comm)))
        return profile

    def _callers(self, pid: int, addresses: Sequence[int]) -> List[Frame]:
        """The stack's frames below the CUDA function (its own frame, at the function's
        start, is left out: the sample's API frame stands for it)."""
        frames = []
        for depth, address in enumerate(addresses):
            found = self.resolver.frame(pid, address) if self.resolver and depth == 0 else None
            if found is not None and found.offset == 0:
                continue  # the function itself
            found = (self.resolver.frame(pid, address, return_address=True)
                     if self.resolver else None)
            if found is None:
                frames.append(("0x%x" % address, "?"))
            elif found.function is None:  # (file-relative: the same in every process)
                frames.append(("%s+0x%x" % (os.path.basename(found.path), found.offset),
                               found.path))
            else:
                frames.append((found.function, found.path))
        return frames

    def close(self) -> None:
        duration = self.last_ns - self.started_ns if self.started_ns is not None else 0
        try:
            self.stream.write(self.profile().encode(duration_ns=duration))
        finally:
            self.stream.close()


def _bytes(api, event: Event) -> int:
    from ..decode.operations import byte_count

    return byte_count(api, {**event.outs, **event.args}) or 0


# -- from the monitor's counts ---------------------------------------------------------------

def profile_of_monitor(families: Sequence, launches: Dict[Tuple[str, str, str], int],
                       started_at: float) -> bytes:
    """A profile of the monitor's families (calls, time, bytes per function) and its
    launches by (comm, api, kernel label), all processes of the run."""
    by_name = {family.name: family for family in families}
    profile = Profile()

    def per_api(name: str, index: int, value=lambda v: v) -> None:
        for labels, sample in by_name[name].samples:
            api = dict(labels)["api"]
            values = [0] * len(SAMPLE_TYPES)
            values[index] = value(sample)
            profile.add([(api, "[%s]" % BY_NAME[api].library)], values)

    per_api("ebpf_cuda_api_calls", CALLS)
    per_api("ebpf_cuda_api_duration_seconds", TIME, lambda h: round(h.sum * 1e9))
    per_api("ebpf_cuda_alloc_bytes", ALLOC)
    per_api("ebpf_cuda_memcpy_bytes", COPY)
    for (comm, api, kernel), count in launches.items():
        values = [0] * len(SAMPLE_TYPES)
        values[LAUNCHES] = count
        profile.add([(kernel, "[kernel]"), (api, "[%s]" % BY_NAME[api].library)], values,
                    (("comm", comm),))
    now = time.time()
    return profile.encode(int(started_at * 1e9), int((now - started_at) * 1e9))
