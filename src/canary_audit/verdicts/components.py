"""What a config could see before its run: the variance components of the
papers' value claims, measured on a finished run and stored with the
package (`components.json`, beside floors.json), and the smallest effect
each would detect at a config's seeds and authors (power.py).

`python -m canary_audit power --tables results/seeds/tables --store`
measures them on the results run's seed x author layout (item_cells);
`plan` prints the statement for its config.  The components are this
model's at this scale: a 7B run's differ, and its first run should replace
them.
"""

from __future__ import annotations

import json
from pathlib import Path

from canary_audit.verdicts import power
from canary_audit.verdicts.claims import fields_of, paper_claims
from canary_audit.verdicts.intervals import Components
from canary_audit.verdicts.judge import gather
from canary_audit.verdicts.measures import MEASURES
from canary_audit.verdicts.readings import Run

COMPONENTS_FILE = Path(__file__).with_name("components.json")


def measure(tables: Path) -> list[dict]:
    """Per value claim of the papers' files with item cells in the run: its
    seed, author and residual components and the layout they rest on."""
    run = Run(tables)
    fields = fields_of(run.variants, run.cells)
    rows = []
    for claim in paper_claims():
        if MEASURES[claim.measure].read is not None:
            continue
        found = gather(run, claim, fields).evidence
        c = found.interval.components if found is not None else None
        if c is None:
            continue
        rows.append({"claim": claim.id, "measure": claim.measure, "effect": claim.effect, "seeds": c.seeds,
                     "items": c.items, "var_seed": None if c.seeds < 2 else c.var_seed, "var_item": c.var_item,
                     "var_resid": c.var_resid, "ms_seed": None if c.seeds < 2 else c.ms_seed})
    return rows


def store(tables: Path, run: str, out: Path = COMPONENTS_FILE) -> dict:
    rows = measure(tables)
    if not rows:
        raise FileNotFoundError(f"`{tables}`: no value claim of the papers' files has item cells there; give the "
                                "tables folder of a run that trains paper A's arms (item_cells)")
    data = {"run": run, "claims": rows}
    out.write_text(json.dumps(data, indent=2) + "\n")
    return data


def load(path: Path = COMPONENTS_FILE) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _components(row: dict) -> Components:
    """The stored components as power.py reads them (its mean squares rebuilt
    from them where it needs the seed's)."""
    nan = float("nan")
    return Components(row["seeds"], row["items"], nan, (), row["ms_seed"] if row["ms_seed"] is not None else nan,
                      nan, row["var_resid"], row["var_seed"] if row["var_seed"] is not None else nan,
                      row["var_item"], row["var_resid"], (), False)


def render(data: dict | None, seeds: int, authors: int) -> str:
    """The plan's power section: per value claim, the smallest effect a
    config with `seeds` training seeds and `authors` authors detects."""
    if not data or not data.get("claims"):
        return "No variance components stored (`python -m canary_audit power --tables ... --store`)."
    lines = [f"Smallest effect each of the papers' value claims detects at 80% power (two-sided 5%) at this "
             f"config's {seeds} seed(s) x {authors} authors, from the components of {data.get('run') or 'a stored run'}"
             " (with one seed the seed component cannot enter: such a figure is marked):", "",
             "| claim | measured at | detectable here | the claim's effect | within reach |", "|---|---|---|---|---|"]
    for row in data["claims"]:
        c = _components(row)
        d = power.detectable(c, seeds=seeds, items=authors)
        effect = row["effect"]
        reach = "n/a" if effect is None else "yes" if abs(effect) >= d else "no"
        lines.append(f"| {row['claim']} | {row['seeds']} seeds x {row['items']} authors | {d:.3g}"
                     + (" (one seed: the author-level test, seed variance not in it)" if seeds < 2 else "")
                     + f" | {'' if effect is None else effect} | "
                     f"{reach} |")
    return "\n".join(lines)


def power_report(tables: Path, run: str = "", keep: bool = False) -> tuple[str, dict]:
    """The components of a finished run and what they imply at its own
    layout; with `keep` stored for `plan`."""
    data = store(tables, run) if keep else {"run": run, "claims": measure(tables)}
    if not data["claims"]:
        raise FileNotFoundError(f"`{tables}`: no value claim of the papers' files has item cells there")
    first = data["claims"][0]
    return render(data, first["seeds"], first["items"]) + "\n", {
        "claims": len(data["claims"]), "stored": str(COMPONENTS_FILE) if keep else None}
