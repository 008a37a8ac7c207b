"""Plots: pictures of the tables, drawn from the tables' CSVs and the token
records only (never a model), so they re-draw with the tables.

Each function takes frames and returns a matplotlib Figure; `write_plots`
draws them all into a folder.  The Agg backend is forced: jobs run headless.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl

from canary_audit.publish.attack_plots import audit_bound_figure, relearning_figure
from canary_audit.publish.catalog import registry
from canary_audit.publish.figure_kit import empty_figure, error_bars, pyplot
from canary_audit.publish.table_files import concat_records
from canary_audit.views.metrics import position_deltas
from canary_audit.views.mia import ATTACKS, item_scores, roc_curve
from canary_audit.views.table import read_table

# Plots drawn from the token records, not from a table.
RECORD_PLOTS = ("delta_nll_positions", "mia_roc")
VERDICT_COLOURS = {"up": "#d6604d", "down": "#4393c3", "flat": "#e0e0e0", "kept": "#e0e0e0"}
MATRIX_PROBES = (("v_window", "Delta mean-K"), ("v_secret", "Delta secret"), ("v_hit1", "hit@1"),
                 ("v_hitk", "hit@k"), ("v_decoy", "decoy contrast"))
RATES = (("out_acc", "out_acc (answer)", "tab:blue"), ("thk_leak", "thk_leak (trace)", "tab:orange"),
         ("gap", "gap = thk - out", "tab:green"))


AUTHOR_KINDS = ("memorized", "unlearned")


def _audited(frame: pl.DataFrame, variants: dict[str, dict]) -> pl.DataFrame:
    """Rows of memorized and unlearned variants, by their kind in the
    design's variant table (the base model and hex-canary adapters hold no
    author canaries); every row when no variant table is given; empty when
    the table is."""
    if "variant" not in frame.columns:
        return pl.DataFrame()
    if not variants:
        return frame
    keep = [name for name, fields in variants.items() if fields.get("kind") in AUTHOR_KINDS]
    return frame.filter(pl.col("variant").is_in(keep))


def k_sweep_figure(sweep: pl.DataFrame):
    """One panel per (model, template, unlearning run, seed): out_acc, thk_leak and the
    gap against K, with their bootstrap CIs as bands."""
    plt = pyplot()
    if sweep.is_empty():
        return empty_figure(plt, "no unlearning runs in these records")
    runs = sweep.select("model", "template", "run", "seed").unique().sort("model", "template", "run", "seed")
    fig, axes = plt.subplots(1, runs.height, figsize=(4 * runs.height, 3.4), squeeze=False, sharey=True)
    for ax, run in zip(axes[0], runs.iter_rows(named=True)):
        part = sweep.filter(**run).sort("k")
        for col, label, colour in RATES:
            ax.plot(part["k"], part[col], marker="o", color=colour, label=label)
            ax.fill_between(part["k"], part[f"{col}_lo"], part[f"{col}_hi"], color=colour, alpha=0.2)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_title(f"{run['model']} {run['template']} {run['run']} s{run['seed']}")
        ax.set_xlabel("unlearning steps K")
    axes[0][0].set_ylabel("rate (AUTO arm)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def _grouped_bars(ax, frame: pl.DataFrame, groups: list[str], series: list[tuple[str, str]], err: bool = True):
    width = 0.8 / max(1, len(series))
    for j, (col, label) in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, frame[col].to_list(), width, label=label, yerr=error_bars(frame, col) if err else None, capsize=2)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)


def _bar_figure(frame: pl.DataFrame, labels: list[str], series: list[tuple[str, str]], title: str,
                ylabel: str, width_per_group: float, err: bool = True, zero_line: bool = False):
    """Grouped bars, one group per label, one bar per series (with CIs when `err`)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6, width_per_group * len(labels)), 3.6))
    _grouped_bars(ax, frame, labels, series, err=err)
    if zero_line:
        ax.axhline(0, color="grey", lw=0.5)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _short(variants) -> list[str]:
    return [v.split("/", 1)[1] for v in variants]


def prefill_arms_figure(prefill: pl.DataFrame, variants: dict[str, dict]):
    """out_acc of every arm at fixed weights, per variant, with CIs."""
    frame = _audited(prefill, variants)
    if frame.is_empty():
        return empty_figure(pyplot(), "no memorized variants in these records")
    # (the planted controls' own arms are columns of their rows alone)
    arms = [c for c in frame.columns if (c == "auto" or c.startswith("prefill_")) and not c.endswith(("_lo", "_hi"))
            and frame[c].null_count() < frame.height]
    return _bar_figure(frame, _short(frame["variant"]), [(a, a) for a in arms],
                       "Prefill arms at fixed weights (AUTO = the model's own trace)", "out_acc", 1.1)


def teacher_forced_vs_greedy_figure(tfg: pl.DataFrame, variants: dict[str, dict]):
    """Greedy out_acc beside teacher-forced top-1 rate, per variant and prefill arm."""
    frame = _audited(tfg, variants)
    if frame.is_empty():
        return empty_figure(pyplot(), "no teacher-forced canary records")
    frame = frame.sort("variant", "arm")
    labels = [f"{v}\n{a.removeprefix('prefill_')}" for v, a in zip(_short(frame["variant"]), frame["arm"])]
    return _bar_figure(frame, labels, [("greedy_out_acc", "greedy out_acc"), ("tf_top1_rate", "teacher-forced top-1")],
                       "Same canaries, same weights: greedy recall vs teacher-forced top-1", "rate", 0.6)


def parser_conventions_figure(conventions: pl.DataFrame, variants: dict[str, dict]):
    """The AUTO gap of each unlearned or memorized variant under every parser convention."""
    frame = _audited(conventions, variants)
    if frame.is_empty():
        return empty_figure(pyplot(), "no memorized variants in these records")
    names = sorted(frame["convention"].unique().to_list())
    wide = frame.pivot(on="convention", index="variant", values="gap").sort("variant")
    return _bar_figure(wide, _short(wide["variant"]), [(c, c) for c in names],
                       "One set of generations, six parser conventions", "gap = thk_leak - out_acc", 1.1,
                       err=False, zero_line=True)


def delta_nll_figure(deltas: pl.DataFrame, window_k: int):
    """Heat map: rows = (variant, probe set), columns = token position over
    preamble + secret, colour = mean Delta NLL against the parent; the line
    marks the end of the mean-K window."""
    plt = pyplot()
    if deltas.is_empty():
        return empty_figure(plt, "no hex-canary token records with a parent")
    deltas = deltas.with_columns(probe_set=pl.col("probe_set") + pl.when(pl.col("modality") == "image")
                                 .then(pl.lit(" (image)")).otherwise(pl.lit("")))
    rows = deltas.select("variant", "probe_set").unique().sort("variant", "probe_set")
    width = int(deltas["position"].max())
    grid = [[float("nan")] * width for _ in range(rows.height)]
    index = {r: i for i, r in enumerate(rows.rows())}
    for variant, probe_set, position, delta in deltas.select("variant", "probe_set", "position", "delta_nll").rows():
        grid[index[(variant, probe_set)]][position - 1] = delta
    bound = max(1e-6, float(deltas["delta_nll"].abs().max()))
    fig, ax = plt.subplots(figsize=(min(18, 2 + 0.18 * width), 1 + 0.35 * rows.height))
    image = ax.imshow(grid, aspect="auto", cmap="coolwarm", vmin=-bound, vmax=bound,
                      extent=(0.5, width + 0.5, rows.height - 0.5, -0.5))
    ax.axvline(window_k + 0.5, color="black", lw=1.5, ls="--")
    ax.text(window_k + 0.7, -0.4, f"K={window_k}", fontsize=8, va="top")
    ax.set_yticks(range(rows.height))
    ax.set_yticklabels([f"{v.split('/', 1)[1]} {p}" for v, p in rows.rows()], fontsize=7)
    ax.set_xlabel("token position (preamble, then secret)")
    fig.colorbar(image, ax=ax, label="mean Delta NLL vs parent")
    ax.set_title("Per-position Delta NLL: where the change sits relative to the window")
    fig.tight_layout()
    return fig


def disagreement_figure(matrix: pl.DataFrame):
    """Cell x probe grid coloured by verdict (up / down / unchanged), the
    probe's Delta written in each square, and the diagnosis beside each row."""
    plt = pyplot()
    if matrix.is_empty():
        return empty_figure(plt, "no bSFT cells in these records")
    from matplotlib.colors import to_rgb

    rows = matrix.sort("model", "modality", "canary_seed", "cell")
    values = {"v_window": "delta_window", "v_secret": "delta_secret", "v_hit1": "hit1", "v_hitk": "hitk",
              "v_decoy": "decoy_contrast"}
    grid = [[to_rgb(VERDICT_COLOURS.get(r[v] or "", "#ffffff")) for v, _ in MATRIX_PROBES]
            for r in rows.iter_rows(named=True)]
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.32 * rows.height))
    ax.imshow(grid, aspect="auto", extent=(-0.5, len(MATRIX_PROBES) - 0.5, rows.height - 0.5, -0.5))
    for i, r in enumerate(rows.iter_rows(named=True)):
        for j, (v, _) in enumerate(MATRIX_PROBES):
            value = r.get(values[v])
            ax.text(j, i, "" if value is None else f"{value:+.3f}" if "hit" not in v else f"{value:.2f}",
                    ha="center", va="center", fontsize=7)
        if r["diagnosis"] == "inconclusive":
            label = f"inconclusive ({r.get('inconclusive_probes')}); points read: {r.get('point_diagnosis')}"
        else:
            weak = " (its evidence does not hold)" if r.get("evidence_supports") is False else ""
            label = r["diagnosis"] + weak
        ax.text(len(MATRIX_PROBES) - 0.35, i, label, va="center", fontsize=8,
                color="black" if r["diagnosis"] == "agree" else "darkred")
    ax.set_xticks(range(len(MATRIX_PROBES)))
    ax.set_xticklabels([label for _, label in MATRIX_PROBES], fontsize=8)
    ax.set_yticks(range(rows.height))
    ax.set_yticklabels([f"{r['model']} {r['modality']}: {r['cell']} (c{r['canary_seed']})"
                        for r in rows.iter_rows(named=True)], fontsize=7)
    ax.set_xlim(-0.5, len(MATRIX_PROBES) + 4.5)
    ax.set_title("Verdict per probe (red: up, blue: down, grey: unchanged, white: inconclusive, its CI "
                 "straddling the threshold) and the detector's diagnosis", fontsize=10)
    fig.tight_layout()
    return fig


ROC_KINDS = ("base", "canary", "canary_undertrained")


def roc_figure(scores: pl.DataFrame, variants: dict[str, dict]):
    """ROC of each membership-inference attack, hex canaries against the
    non-member records, on log-log axes (the low-FPR region is what an
    auditor reads; Carlini et al. 2022), for the base model, the canary
    LoRA and its undertrained copy of each model and modality."""
    plt = pyplot()
    keep = [v for v, row in variants.items() if row.get("kind") in ROC_KINDS]
    chosen = scores.filter(pl.col("variant").is_in(keep) & (pl.col("population") == "hex")) if scores.height \
        else scores
    if chosen.is_empty():
        return empty_figure(plt, "no membership-inference records (hex canaries and non-members) of the base or canary")
    fig, axes = plt.subplots(1, len(ATTACKS), figsize=(4 * len(ATTACKS), 4), sharey=True)
    for ax, attack in zip(axes, ATTACKS):
        for (variant, modality), part in chosen.group_by("variant", "modality", maintain_order=True):
            members = part.filter(pl.col("member"))[attack].to_numpy()
            nonmembers = part.filter(~pl.col("member"))[attack].to_numpy()
            if not len(members) or not len(nonmembers):
                continue
            fpr, tpr = roc_curve(members, nonmembers)
            ax.step(np.maximum(fpr, 1e-3), np.maximum(tpr, 1e-3), where="post",
                    label=f"{variant.split('/', 1)[1]} ({variant.split('/', 1)[0]}, {modality})")
        ax.plot([1e-3, 1], [1e-3, 1], color="grey", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(attack)
        ax.set_xlabel("false-positive rate (non-members)")
    axes[0].set_ylabel("true-positive rate (hex canaries)")
    axes[-1].legend(fontsize=6, loc="lower right")
    fig.suptitle("Membership inference ROC, hex canaries vs never-trained records of their format")
    fig.tight_layout()
    return fig


# Exposure by extrapolation: rank interpolation saturates at log2 R once a
# canary beats every candidate, which a memorized stratum does at once.
DOSE_PANELS = (("hit1", "greedy hit@1"), ("exposure_extrapolation", "exposure, skew-normal extrapolation (bits)"),
               ("auc_min_k_pp", "MIA AUC, Min-K%++"))


def dose_response_figure(strata: pl.DataFrame, variants: dict[str, dict]):
    """Secret Sharer's dose-response: each probe against how many times the
    canaries were inserted (log2 axis), with CI bars, for the base model,
    the canary LoRA and its undertrained copy of each model and modality."""
    plt = pyplot()
    keep = [v for v, row in variants.items() if row.get("kind") in ROC_KINDS]
    chosen = strata.filter(pl.col("variant").is_in(keep)) if strata.height else strata
    if chosen.is_empty():
        return empty_figure(plt, "one repetition stratum (`audit.hex_repetitions`): no dose-response to draw")
    panels = [(c, label) for c, label in DOSE_PANELS if c in chosen.columns]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4))
    for ax, (column, label) in zip(np.atleast_1d(axes), panels):
        for (variant, modality), part in chosen.sort("repetitions").group_by("variant", "modality",
                                                                            maintain_order=True):
            ax.errorbar(part["repetitions"].to_list(), part[column].to_list(), yerr=error_bars(part, column),
                        marker="o", capsize=3,
                        label=f"{variant.split('/', 1)[1]} ({variant.split('/', 1)[0]}, {modality})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("times inserted in the canary LoRA's data")
        ax.set_title(label)
    handles, labels = np.atleast_1d(axes)[-1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7)
    fig.suptitle("Dose-response over the repetition strata (bootstrap CIs)")
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    return fig


# Plot name -> its figure, given its table's frame and the variant table.
TABLE_FIGURES: dict[str, Callable[[pl.DataFrame, dict], object]] = {
    "k_sweep": lambda frame, _: k_sweep_figure(frame),
    "prefill_arms": prefill_arms_figure,
    "teacher_forced_vs_greedy": teacher_forced_vs_greedy_figure,
    "parser_conventions": parser_conventions_figure,
    "disagreement_matrix": lambda frame, _: disagreement_figure(frame),
    "dose_response": dose_response_figure,
    "relearning": relearning_figure,
    "audit_bound": audit_bound_figure,
}
PLOTS = (*(plot for t in registry() for plot in t.plots), *RECORD_PLOTS)


def write_plots(tables_dir: Path, tokens: pl.DataFrame, cfg: dict, out_dir: Path) -> list[str]:
    """Every plot, as PNG, from a tables folder and the token records;
    `cfg["variants"]` (the design's variant table) picks the author-probe
    variants of the paper A bar charts."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    variants = cfg.get("variants", {})
    declared = cfg.get("tables")

    def table(name: str) -> pl.DataFrame:
        """A declared table (Design.table_names), never one an earlier run of
        another config left in the folder."""
        path = Path(tables_dir) / f"{name}.csv"
        if declared is not None and name not in declared:
            return pl.DataFrame()
        frame = read_table(path)
        return pl.DataFrame() if frame is None else frame

    # A table's plots, as the table registry names them (Table.plots).
    figures = {plot: TABLE_FIGURES[plot](table(t.name), variants) for t in registry() for plot in t.plots}
    figures["delta_nll_positions"] = delta_nll_figure(
        position_deltas(tokens.filter(pl.col("probe_set") == "hex") if tokens.height else tokens,
                        cfg.get("parents", {})), cfg["window_k"])
    figures["mia_roc"] = roc_figure(item_scores(tokens, cfg["mia"]["min_k"]), variants) \
        if tokens.height and "mia" in cfg \
        else empty_figure(pyplot(), "no token records or no membership-inference settings (`mia`: min_k)")
    plt = pyplot()
    for name, fig in figures.items():
        tmp = out_dir / f".{name}.tmp.png"
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        tmp.replace(out_dir / f"{name}.png")
    return list(figures)


def write_plots_from(tables_dir: Path, token_files: list[Path], cfg: dict, out_dir: Path) -> list[str]:
    """Every plot from a tables folder and the token records files."""
    return write_plots(tables_dir, concat_records(token_files, "token"), cfg, out_dir)
