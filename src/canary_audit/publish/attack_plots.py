"""Plots of the attacks on a claim: recall against the relearning budget
(the recovery table) and the one-run audit bound against the number of
guesses (the audit_bound_guesses table)."""

from __future__ import annotations

import polars as pl

from canary_audit.data.relearn import ATTACK_PREFIX
from canary_audit.publish.figure_kit import empty_figure, error_bars, pyplot

RELEARN_ROLES = (("unlearned", "unlearned", None), ("memorized", "memorized parent (ceiling)", "tab:blue"),
                 ("reference", "never-trained reference (negative)", "tab:gray"),
                 ("positive", "suppression plant (positive)", "tab:green"))


def relearning_figure(recovery: pl.DataFrame, _variants: dict[str, dict]):
    """Recall (out_acc, with its CI) against the relearning budget, one
    panel per (model, seed, data): each attacked twin's value before
    relearning at step 0, then after each budget; a `forget` relearning on
    the held-out authors alone."""
    plt = pyplot()
    rows = recovery.filter(pl.col("attack").str.starts_with(ATTACK_PREFIX) & (pl.col("measure") == "out_acc")) \
        if recovery.height and "steps" in recovery.columns else pl.DataFrame()
    if rows.is_empty():
        return empty_figure(plt, "no relearning attack in this run (`recovery.relearn`)")
    # The attack without its budget (data/relearn.attack_name ends in `-t<steps>`): one panel per data.
    rows = rows.with_columns(data=pl.col("attack").str.strip_suffix(pl.format("-t{}", pl.col("steps"))))
    panels = rows.select("model", "seed", "data").unique().sort("model", "seed", "data")
    fig, axes = plt.subplots(1, panels.height, figsize=(4.5 * panels.height, 3.6), squeeze=False, sharey=True)
    for ax, panel in zip(axes[0], panels.iter_rows(named=True)):
        part = rows.filter(**panel)
        for role, label, colour in RELEARN_ROLES:
            lines = part.filter(pl.col("role") == role).sort("steps").group_by("twin", maintain_order=True)
            for (twin,), line in lines:
                start = line.head(1).select("before", "before_lo", "before_hi").rename(
                    {"before": "after", "before_lo": "after_lo", "before_hi": "after_hi"})
                points = pl.concat([start.with_columns(steps=pl.lit(0, pl.Int64)),
                                    line.select("steps", "after", "after_lo", "after_hi")], how="diagonal")
                own = role == "unlearned"  # one line per unlearned checkpoint, in colours of its own
                ax.errorbar(points["steps"].to_list(), points["after"].to_list(), yerr=error_bars(points, "after"),
                            marker="s" if own else "o", capsize=3, color=None if own else colour,
                            label=f"{twin.split('/', 1)[-1]}" if own else label)
                label = None  # one legend entry per control role
        ax.set_xlabel("relearning steps")
        ax.set_title(f"{panel['model']} s{panel['seed']}: {panel['data']}", fontsize=9)
        ax.set_ylim(-0.05, 1.05)
    axes[0][0].set_ylabel("out_acc (held-out authors for `forget`)")
    handles, labels = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=7)
    fig.suptitle("Recall against the relearning budget (author-clustered CIs)")
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    return fig


def audit_bound_figure(guesses: pl.DataFrame, _variants: dict[str, dict]):
    """The one-run bound against the number of guesses (the grid's k+ +
    k-), one line per variant at its best score for each count, beside the
    most those guesses could show (every one right, dashed): a line at the
    dashed one has spent its candidates, one below it more guesses did not
    help."""
    plt = pyplot()
    if guesses.is_empty():
        return empty_figure(plt, "no one-run audit bound in this run (`data.inclusion` / `hex_inclusion: coin`)")
    keys = ["variant", "population"]
    best = guesses.group_by(*keys, "guesses").agg(pl.col("epsilon_lower").max(), pl.col("all_right").max())
    several = best["population"].n_unique() > 1  # name the canaries where the run draws both kinds
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for (variant, population), line in best.sort(*keys, "guesses").group_by(*keys, maintain_order=True):
        ax.plot(line["guesses"].to_list(), line["epsilon_lower"].to_list(), marker="o",
                label=variant.split("/", 1)[-1] + (f" ({population})" if several else ""))
    ceiling = best.group_by("guesses").agg(pl.col("all_right").max()).sort("guesses")
    ax.plot(ceiling["guesses"].to_list(), ceiling["all_right"].to_list(), "k--",
            label="every guess right (the most they could show)")
    ax.set_xlabel("guesses (k+ highest as members, k- lowest as non-members)")
    ax.set_ylabel("epsilon_lower (delta = 0; search paid for)")
    ax.legend(fontsize=7)
    fig.suptitle("One-run audit bound against the number of guesses")
    fig.tight_layout()
    return fig
