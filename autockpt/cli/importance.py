"""``autockpt interpret`` on the terminal and as a picture: each input's mean selection weight,
by group, and the attention by lag (NOTE [Reading the TFT's weights] in
:mod:`autockpt.training.forecasts.interpret`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from autockpt.training.forecasts.interpret import InputImportance

#: The groups of inputs, as the table and the picture title them.
GROUPS = {
    "static": "static inputs",
    "encoder": "past inputs (encoder)",
    "decoder": "known future inputs (decoder)",
}
#: Lags the terminal lists (the JSON and the picture have them all).
SHOWN_LAGS = 10


def print_importance(console: Console, result: InputImportance) -> None:
    """One table per group of inputs, highest weight first, with a bar; then the attention
    paid to the last few bars."""
    console.print(f"over {result.num_windows:,} windows")
    for key, title in GROUPS.items():
        weights: dict[str, float] = getattr(result, key)
        table = Table(title=title)
        table.add_column("input")
        table.add_column("mean weight", justify="right")
        table.add_column("")
        top = max(weights.values(), default=1.0) or 1.0
        for name, weight in weights.items():
            table.add_row(name, f"{weight:.3f}", "█" * max(1, round(12 * weight / top)))
        console.print(table)
    lags = result.attention_by_lag
    if lags:
        shown = ", ".join(f"{k + 1}: {w:.3f}" for k, w in enumerate(lags[:SHOWN_LAGS]))
        console.print(
            f"attention by lag (bars before the forecast: mean weight): {shown}"
            + (f", ... ({len(lags)} lags)" if len(lags) > SHOWN_LAGS else "")
        )


def plot_importance(result: InputImportance, path: Path) -> None:
    """The three groups' importances as horizontal bars and the attention by lag, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from autockpt.training.setup.runs import write_atomic

    rows = max(len(result.encoder), len(result.decoder), len(result.static), 4)
    figure, axes = plt.subplots(2, 2, figsize=(13, 3 + 0.25 * rows))
    for panel, (key, title) in zip(axes.flat, GROUPS.items(), strict=False):
        weights: dict[str, float] = getattr(result, key)
        panel.barh(list(weights), list(weights.values()), color="tab:blue")
        panel.invert_yaxis()
        panel.set_title(title)
        panel.set_xlabel("mean selection weight")
    lags = result.attention_by_lag
    last = axes.flat[3]
    last.bar(range(1, len(lags) + 1), lags, color="tab:purple")
    last.set_title("attention by lag")
    last.set_xlabel("bars before the first forecast bar")
    last.set_ylabel("mean attention")
    figure.tight_layout()
    write_atomic(path, lambda temporary: figure.savefig(temporary, format="png", dpi=110))
    plt.close(figure)
