"""A loaded eBPF program: assembles its instructions, loads them, owns the program fd."""
from typing import Any, Dict, List, Optional, Sequence, Union

from .. import syscalls
from ..errors import KernelError
from .maps import Map

MapRef = Union[Map, int]

BPF_PROG_TYPE_KPROBE = syscalls.BPF_PROG_TYPE_KPROBE
EXPECTED_UPROBE_MULTI = syscalls.BPF_TRACE_UPROBE_MULTI


class Program:
    """An eBPF program (kprobe type, for uprobes) built from `asm` instructions.

    `maps` binds the symbolic map names used by `asm.ld_map` to maps (or raw map fds).
    A GPL-compatible `license` is required for probe_read_user and get_func_ip.
    Use `expected_attach_type=48` (EXPECTED_UPROBE_MULTI) for uprobe_multi links.
    """

    def __init__(self, instructions: Sequence[Any], maps: Optional[Dict[str, MapRef]] = None,
                 name: str = "", license: str = "GPL", expected_attach_type: int = 0,
                 prog_type: int = BPF_PROG_TYPE_KPROBE) -> None:
        syscalls.check_name(name)
        self.instructions = list(instructions)
        self.maps = dict(maps or {})
        self.name = name
        self.license = license
        self.expected_attach_type = expected_attach_type
        self.prog_type = prog_type
        self.log = ""  # verifier log of the last load (empty unless asked for or failed)
        self._code: Optional[bytes] = None
        self._fd: Optional[syscalls.Fd] = None
        self._perf_copy: Optional["Program"] = None

    @classmethod
    def from_bytes(cls, code: bytes, name: str = "", license: str = "GPL",
                   expected_attach_type: int = 0,
                   prog_type: int = BPF_PROG_TYPE_KPROBE) -> "Program":
        """A program from already-assembled bytecode (map fds already in place)."""
        prog = cls([], name=name, license=license, expected_attach_type=expected_attach_type,
                   prog_type=prog_type)
        prog._code = bytes(code)
        return prog

    def map_fds(self) -> Dict[str, int]:
        return {name: (m.fd if isinstance(m, Map) else int(m)) for name, m in self.maps.items()}

    @property
    def code(self) -> bytes:
        """The assembled bytecode (assembled on first use)."""
        if self._code is None:
            from .. import asm  # not needed by programs built from bytes

            self._code = asm.assemble(self.instructions, maps=self.map_fds())
            self.instructions = []  # (the bytecode says it all now: a monitor keeps ~130)
        return self._code

    def load(self, log_level: int = 0) -> "Program":
        """Load into the kernel; VerifierError (with `.log`) if rejected. Returns self.

        log_level=1 keeps the verifier log of a successful load in `self.log`.
        """
        if self._fd is not None and not self._fd.closed:
            raise ValueError("program %r is already loaded" % self.name)
        try:
            self._fd, self.log = syscalls.prog_load(
                self.code, self.prog_type, self.license, self.name, self.expected_attach_type,
                log_level)
        except KernelError as err:
            self.log = err.log
            raise
        return self

    def for_perf_event(self) -> "Program":
        """This program as perf-event attachment takes it: loaded with expected_attach_type
        0. Itself when it was; else (a program loaded for uprobe_multi links, which
        PERF_EVENT_IOC_SET_BPF and perf-event links may refuse) a copy of the same code,
        loaded on first use and unloaded with this one."""
        if self.expected_attach_type == 0:
            return self
        if self._perf_copy is None or not self._perf_copy.loaded:
            copy = Program.from_bytes(self.code, name=self.name, license=self.license,
                                      prog_type=self.prog_type)
            self._perf_copy = copy.load()
        return self._perf_copy

    @property
    def loaded(self) -> bool:
        return self._fd is not None and not self._fd.closed

    @property
    def fd(self) -> int:
        """The program fd; ValueError if not loaded or closed."""
        if self._fd is None:
            raise ValueError("program %r is not loaded" % self.name)
        return self._fd.value

    def info(self) -> syscalls.ProgInfo:
        """The kernel's view of the loaded program (id, tag, run statistics)."""
        return syscalls.prog_info(self.fd)

    def disassembly(self) -> str:
        """A readable listing of the bytecode (to read next to a verifier log)."""
        from .. import asm

        return asm.disassemble(self.code)

    def relevant_log_lines(self, count: int = 12) -> List[str]:
        """The last lines of the verifier log before its verdict: where the reason is."""
        lines = [ln for ln in self.log.splitlines() if ln.strip()]
        return lines[-count:]

    def close(self) -> None:
        """Unload (the kernel frees it once no link or perf event holds it)."""
        if self._fd is not None:
            self._fd.close()
        if self._perf_copy is not None:
            self._perf_copy.close()

    def __enter__(self) -> "Program":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "fd=%d" % self._fd.value if self.loaded else "not loaded"
        return "Program(name=%r, %s)" % (self.name, state)
