"""The one table of traced functions.

One row per CUDA (or NCCL) function: where its arguments are at entry (ABI integer slot: 0-5 are
registers, 6 and up are stack slots), what they are, which out-parameters to read at return,
and how to show them. The probe generator (probes/calls.py) and the decoder (events.py) are both
driven by these rows: adding a function is adding a row.

What a row is, and the vocabularies of its fields, is row.py's; the rows are in rows_runtime.py,
rows_driver.py, rows_nccl.py and rows_graphs.py. Everything is importable from here.
"""
from typing import Dict, Iterable, List, Optional, Tuple

from . import rows_driver, rows_graphs, rows_nccl, rows_runtime
from .row import (  # noqa: F401 (re-exported: the table's vocabulary is importable from here)
    CAPTURED_ROLES, DEVICE, DRIVER, HOST, LIBRARIES, NCCL, RUNTIME, UNIQUE_ID_CELLS, Api, Arg,
    Direction, Kind, Out, Role)

# The rows in function-id order: saved traces and golden listings depend on it, so rows are
# only ever appended (the graph rows came last so that earlier rows kept their ids).
TABLE: Tuple[Api, ...] = (rows_runtime.ROWS + rows_driver.ROWS + rows_nccl.ROWS
                          + rows_graphs.ROWS + rows_runtime.LATER_ROWS
                          + rows_driver.LATER_ROWS)

# The seed tool's eleven functions: `--functions` with these reproduces it exactly.
SEED_FUNCTIONS = tuple(api.name for api in TABLE[:11])

BY_NAME: Dict[str, Api] = {api.name: api for api in TABLE}
FN_ID: Dict[str, int] = {api.name: i for i, api in enumerate(TABLE)}


def select(patterns: Optional[Iterable[str]] = None, library: Optional[str] = None,
           everything: bool = False) -> List[Api]:
    """Rows whose name matches any glob pattern, optionally of one library ("runtime",
    "driver", "nccl"; None or "all" for every one). Without patterns: the default set (rows marked
    default), or every row with `everything`. Raises KeyError naming a pattern that matches
    nothing."""
    import fnmatch

    rows = [api for api in TABLE if library in (None, "all", api.library)]
    if not patterns:
        return [api for api in rows if everything or api.default]
    chosen = []
    for pattern in patterns:
        matched = [api for api in rows if fnmatch.fnmatchcase(api.name, pattern)]
        if not matched:
            raise KeyError(pattern)
        chosen.extend(api for api in matched if api not in chosen)
    return [api for api in TABLE if api in chosen]


def driver_replaces(api: Api) -> bool:
    """A runtime launch function: the default set leaves it out when the driver's launch
    functions are probed (the driver sees every launch and names it)."""
    return api.library == RUNTIME and api.role == Role.LAUNCH


def arg_cells(api: Api) -> List[Tuple[Arg, int]]:
    """Each argument with the index of its first record cell, in order."""
    cells, cell = [], 0
    for arg in api.args:
        cells.append((arg, cell))
        cell += arg.cells
    return cells
