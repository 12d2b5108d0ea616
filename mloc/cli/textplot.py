"""Curves drawn in the terminal, for `mloc plot` without an output file: no dependency.

:func:`plot` draws several series ``{label: [(x, y), ...]}`` on one character grid: each
series gets a marker, points are placed by linear scaling of x and y to the grid's
columns and rows (y grows upwards; a later series overdraws an earlier one where they
meet) and joined by dots, and the y range is printed on the axis, the x range under it, the markers in a
legend. A panel whose points all have one x (a run with one evaluation) draws them in the
middle column with that x under them, not at the left edge of a made-up range.
"""

from __future__ import annotations

import math

MARKERS = "*o+x#@%&=~"


def plot(title: str, series: dict[str, list[tuple[float, float]]], width: int = 64, height: int = 12) -> str:
    """The text of one panel (see the module docstring); non-finite points are skipped."""
    points = {k: [(x, y) for x, y in v if math.isfinite(x) and math.isfinite(y)] for k, v in series.items()}
    points = {k: v for k, v in points.items() if v}
    if not points:
        return f"{title}: no values"
    xs = [x for v in points.values() for x, _ in v]
    ys = [y for v in points.values() for _, y in v]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    single = x1 == x0                       # one x: the middle column
    grid = [[" "] * width for _ in range(height)]
    def cell(x: float, y: float) -> tuple[int, int]:
        col = (width - 1) // 2 if single else round((x - x0) / (x1 - x0) * (width - 1))
        return height - 1 - round((y - y0) / (y1 - y0) * (height - 1)), col

    for i, values in enumerate(points.values()):
        mark = MARKERS[i % len(MARKERS)]
        cells = [cell(x, y) for x, y in sorted(values)]
        for (ra, ca), (rb, cb) in zip(cells, cells[1:]):     # the segments between points, as dots
            for c in range(ca + 1, cb):
                r = round(ra + (rb - ra) * (c - ca) / (cb - ca))
                if grid[r][c] == " ":
                    grid[r][c] = "·"
        for row, col in cells:
            grid[row][col] = mark
    hi, lo = f"{y1:.4g}", f"{y0:.4g}"
    pad = max(len(hi), len(lo))
    lines = [title]
    for r, row in enumerate(grid):
        label = hi if r == 0 else lo if r == height - 1 else ""
        lines.append(f"{label:>{pad}} |{''.join(row)}")
    lines.append(" " * pad + " +" + "-" * width)
    left, right = f"{x0:g}", f"{x1:g}"
    if single:
        axis = left.center(2 * ((width - 1) // 2) + 1).ljust(width)
    else:
        axis = left + right.rjust(width - len(left))
    lines.append(" " * (pad + 2) + axis + "  (step)")
    lines += [f"  {MARKERS[i % len(MARKERS)]} {label}" for i, label in enumerate(points)]
    return "\n".join(lines)
