"""What every figure is drawn with: matplotlib on the Agg backend (jobs
run headless), the figure that stands in for a plot with nothing to draw,
and asymmetric error bars from a table's `_lo` / `_hi` columns."""

from __future__ import annotations

import polars as pl


def pyplot():
    """matplotlib.pyplot on the Agg backend, imported on first use: a
    module that only names a figure loads no matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def empty_figure(plt, message: str):
    """A figure that says why its plot has nothing to draw."""
    fig, ax = plt.subplots(figsize=(5, 1.5))
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center")
    return fig


def error_bars(frame: pl.DataFrame, col: str):
    """Asymmetric error bars from `col`, `col_lo`, `col_hi` (clipped at zero length)."""
    return [
        (frame[col] - frame[f"{col}_lo"]).clip(lower_bound=0).to_list(),
        (frame[f"{col}_hi"] - frame[col]).clip(lower_bound=0).to_list(),
    ]
