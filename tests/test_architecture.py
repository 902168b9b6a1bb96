"""The package's shape (docs/architecture.md): wings in one order, no import cycle, no import
from a lower wing to a higher one, no module over 600 lines and no function over 60.

Imports are read with `ast`, those made inside functions included (a lazy import is still a
dependency), those under `if TYPE_CHECKING:` left out (they never run).
"""
import ast
import re
from pathlib import Path
from typing import Dict, List, Optional, Set

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ebpf_cuda"

# The wings, lowest first: a module may import its own wing and those before it. The top-level
# modules are named on their own; a folder is a wing of its own. (docs/architecture.md says
# the same in prose: change both together.)
WINGS: List[List[str]] = [
    # the design card's fixed points (kernel_abi, descriptors: syscalls' data and Fd)
    ["errors", "value_class", "arch", "descriptors", "kernel_abi", "syscalls", "asm"],
    ["spec"],                                # what is traced, as data
    ["bpf"],                                 # the kernel's objects
    ["targets"],                             # what to trace: files, symbols, processes
    ["probes"],                              # the programs this tool generates
    ["decode"],                              # records into meaning
    ["gpu"],                                 # the GPU's own state: NVML samples and events
    ["analysis"],                            # events into answers
    ["output"],                              # answers and events into files
    ["session", "stream", "tracer",          # the middle: kernel objects, the read loop, the
     "late_loads", "pump"],                  # face, the libraries mapped after the start
    ["monitor"],                             # the always-on agent and its exporters
    ["cli"],                                 # the command
    ["__init__", "__main__", "bundle", "zipapp"],  # the package's doors
]
RANK: Dict[str, int] = {name: rank for rank, names in enumerate(WINGS) for name in names}
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: Dict[str, Path] = {_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def wing(module: str) -> str:
    """The wing a module belongs to: its first name below the package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _resolve(module: str, is_package: bool, level: int, name: Optional[str]) -> str:
    if not level:
        return name or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imports_of(module: str) -> Set[str]:
    """The package's modules that `module` imports, anywhere but under TYPE_CHECKING."""
    path = MODULES[module]
    is_package = path.name == "__init__.py"
    found: Set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node.level, node.module)
            for alias in node.names:
                sub = target + "." + alias.name
                found.add(sub if sub in MODULES else target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {name for name in found if name in MODULES and name != module
            and name != "ebpf_cuda"}  # (the package's door imports nothing eagerly)


GRAPH: Dict[str, Set[str]] = {module: imports_of(module) for module in MODULES}


def test_every_module_is_in_a_wing():
    assert sorted({wing(module) for module in MODULES} - set(RANK)) == []


def test_no_import_runs_from_a_lower_wing_to_a_higher_one():
    upward = sorted("%s -> %s" % (module, target) for module, targets in GRAPH.items()
                    for target in targets if RANK[wing(target)] > RANK[wing(module)])
    assert upward == []


def _cycles() -> List[List[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    groups: List[List[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(GRAPH[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(GRAPH):
        if node not in index:
            connect(node)
    return groups


def test_no_import_cycle():
    assert _cycles() == []


def test_the_cycle_finder_finds_one(monkeypatch):
    """The check above can fail: a planted cycle is found."""
    planted = {name: set(targets) for name, targets in GRAPH.items()}
    planted["ebpf_cuda.spec.apis"].add("ebpf_cuda.tracer")
    planted["ebpf_cuda.tracer"].add("ebpf_cuda.spec.apis")
    monkeypatch.setattr(__import__(__name__), "GRAPH", planted)
    assert ["ebpf_cuda.spec.apis", "ebpf_cuda.tracer"] in [
        [m for m in group if m in ("ebpf_cuda.spec.apis", "ebpf_cuda.tracer")]
        for group in _cycles()]


def test_no_module_is_over_600_lines():
    long = sorted("%s: %d" % (module, len(path.read_text().splitlines()))
                  for module, path in MODULES.items()
                  if len(path.read_text().splitlines()) > MAX_MODULE_LINES)
    assert long == []


def test_no_function_is_over_60_lines():
    long = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append("%s.%s (line %d): %d" % (module, node.name, node.lineno, lines))
    assert sorted(long) == []


def test_the_graph_sees_imports_inside_functions():
    """A lazy import counts: the CLI imports the report and monitor commands inside a function
    only (start-up time), and the graph holds them."""
    body = ast.parse(MODULES["ebpf_cuda.cli.main"].read_text()).body
    top_level = {node.module for node in body if isinstance(node, ast.ImportFrom)}
    assert top_level and not top_level & {"report", "monitor"}
    assert {"ebpf_cuda.cli.report", "ebpf_cuda.cli.monitor"} <= GRAPH["ebpf_cuda.cli.main"]


def test_docs_architecture_names_every_module_in_its_wing():
    """docs/architecture.md matches the code: its table lists the wings in WINGS' order, and
    each module is named (`name.py`) in its own wing's row."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    rows = [line for line in page.splitlines() if re.match(r"\| \d+ \| ", line)]
    assert len(rows) == len(WINGS)
    for row, names in zip(rows, WINGS):
        first = names[0]
        assert "`%s/`" % first in row or "`%s.py`" % first in row, (row, names)
    unnamed = sorted(module for module, path in MODULES.items() if path.name != "__init__.py"
                     and wing(module) != "asm"  # (the assembler: one unit, docs/design.md)
                     and "`%s`" % path.name not in rows[RANK[wing(module)]])
    assert unnamed == []
