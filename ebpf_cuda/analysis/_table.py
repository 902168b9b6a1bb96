"""Plain-text tables with columns sized to their contents (numbers right-aligned)."""
import time
from typing import List, Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[int] = ()) -> str:
    """Rows of cell strings under headers and a dashed rule; columns in `left` align left.
    Lines start with a space and carry no trailing blanks (like `nsys stats`)."""
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.ljust(w) if i in left else c.rjust(w)
                 for i, (c, w) in enumerate(zip(cells, widths))]
        return (" " + "  ".join(parts)).rstrip()

    lines: List[str] = [line(headers), line(["-" * w for w in widths])]
    lines += [line(row) for row in rows]
    return "\n".join(lines)


def integer(value: float) -> str:
    """1234567 → '1,234,567'."""
    return "{:,}".format(int(round(value)))


def decimal(value: float, places: int = 1) -> str:
    """1234.56 → '1,234.6'."""
    return "{:,.{}f}".format(value, places)


def clock(ts: float) -> str:
    """Wall-clock seconds as the text output shows them: HH:MM:SS.ffffff (local time)."""
    return "%s.%06d" % (time.strftime("%H:%M:%S", time.localtime(ts)), int(ts * 1e6) % 1000000)
