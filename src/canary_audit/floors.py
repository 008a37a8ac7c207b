"""How a detection floor scales with the number of canaries, and the n at
which a paper's effect would clear it.

A run's `detection_floor` table gives, per paper B claim, the smallest share
of its n canaries that a diluted plant must touch for the detector to read
the claim (`floor_share`), and the claim's effect there in the paper's unit
(`floor_effect`).  Measured at two or more n (the default's 20,
configs/floor80.yaml's 80), the floor is fitted as `a + b / sqrt(n)`: a CI
narrows as 1/sqrt(n), and the verdicts' fixed threshold (`a`) stays.  The
n a paper's effect needs is where the fit falls to it; none where `a` is
above it (no n helps: the threshold itself is the bar).

The measured floors are stored with the package (`floors.json`, written by
`python -m canary_audit floors --tables ... --store`) so `plan` can say,
before any run, which claims a config's n could see.  The fit rests on a
grid of shares (controls.FLOOR_SHARES): a floor is known to one grid step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl

from canary_audit.claims.judge import paper_claims
from canary_audit.claims.measures import MEASURES
from canary_audit.controls import FLOOR_COMPOSED

FLOORS_FILE = Path(__file__).with_name("floors.json")
CONSTRUCTION = "composed"  # the construction every claim with a floor has (views/controls.py)


def measured(tables: list[Path]) -> list[dict]:
    """Per claim and n: the floor each run's detection_floor table gives
    (composed dilutions; the least sensitive model), and the run it is from."""
    points = []
    for folder in tables:
        frame = pl.read_csv(Path(folder) / "detection_floor.csv")
        config = json.loads((Path(folder) / "view_config.json").read_text())
        frame = frame.filter(pl.col("construction") == CONSTRUCTION)
        for (claim,), part in frame.group_by("claim", maintain_order=True):
            worst = part.sort("floor_share", nulls_last=True).row(-1, named=True)
            points.append({"claim": claim, "canaries": int(part["canaries"][0]),
                           "floor_share": worst["floor_share"], "floor_effect": worst["floor_effect"],
                           "tables": str(folder), "code_version": config.get("code_version", "")})
    return sorted(points, key=lambda p: (p["claim"], p["canaries"]))


def fit(points: list[dict], unit: str) -> tuple[float, float] | None:
    """(a, b) of `a + b / sqrt(n)` through the points' floors in `unit`
    (floor_share or floor_effect), least squares over two or more n; None
    where fewer than two n have a floor."""
    pairs = [(1 / math.sqrt(p["canaries"]), p[unit]) for p in points if p.get(unit) is not None]
    if len({x for x, _ in pairs}) < 2:
        return None
    mx, my = sum(x for x, _ in pairs) / len(pairs), sum(y for _, y in pairs) / len(pairs)
    b = sum((x - mx) * (y - my) for x, y in pairs) / sum((x - mx) ** 2 for x, _ in pairs)
    return my - b * mx, b


def needed(coefficients: tuple[float, float] | None, effect: float) -> int | None:
    """The smallest n whose fitted floor is at or below `effect` (None: no
    n, the fit's limit is above it, or no fit); 1 where every n is."""
    if coefficients is None:
        return None
    a, b = coefficients
    if b <= 0:
        return 1 if a <= effect else None
    if effect <= a:
        return None
    return max(1, math.ceil((b / (effect - a)) ** 2))


def paper_effects() -> dict[str, tuple[str, str, float]]:
    """control key -> (claim id, the floor column it compares with, the
    paper's effect), for the shipped claims whose measure has a floor."""
    out = {}
    for claim in paper_claims():
        measure = MEASURES[claim.measure]
        if not (measure.floor and measure.control in FLOOR_COMPOSED):
            continue
        if claim.effect_share is not None:
            out[measure.control] = (claim.id, "floor_share", claim.effect_share)
        elif claim.effect_size is not None:
            out[measure.control] = (claim.id, "floor_effect", claim.effect_size)
    return out


def summary(points: list[dict]) -> list[dict]:
    """Per claim with a floor: the paper's effect, the measured floors, the
    fit and the canaries the paper's effect needs."""
    rows = []
    for control, (claim_id, unit, effect) in paper_effects().items():
        mine = [p for p in points if p["claim"] == control]
        coefficients = fit(mine, unit)
        rows.append({"claim": claim_id, "control": control, "unit": unit, "paper_effect": effect,
                     "measured": {str(p["canaries"]): p[unit] for p in mine},
                     "fit": None if coefficients is None else {"a": coefficients[0], "b": coefficients[1]},
                     "canaries_needed": needed(coefficients, effect),
                     "from": sorted({p["tables"] for p in mine})})
    return rows


def store(tables: list[Path], out: Path = FLOORS_FILE, run: str = "") -> dict:
    """Measure, fit and write the floors file `plan` reads."""
    points = measured(tables)
    data = {"run": run, "points": points, "claims": summary(points)}
    out.write_text(json.dumps(data, indent=2) + "\n")
    return data


def load(path: Path = FLOORS_FILE) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def render(data: dict | None, n_canaries: int) -> str:
    """The plan's floors section: per claim with a floor, the paper's effect,
    the fitted floor at this config's n, and the n its effect needs."""
    if not data or not data.get("claims"):
        return "No detection floor measured (`python -m canary_audit floors --store`)."
    lines = [f"Detection floors (fitted a + b/sqrt(n) from {data.get('run') or 'the stored runs'}; a floor is "
             f"known to one step of the share grid) at this config's {n_canaries} hex canaries:", "",
             "| claim | unit | paper's effect | measured floors (n: floor) | floor at this n | visible here | "
             "canaries needed |", "|---|---|---|---|---|---|---|"]
    for row in data["claims"]:
        fitted = row["fit"]
        at_n = None if fitted is None else fitted["a"] + fitted["b"] / math.sqrt(n_canaries)
        unit = "share of canaries" if row["unit"] == "floor_share" else "effect (paper's unit)"
        shown = ", ".join(f"{n}: {v:.4g}" if v is not None else f"{n}: none read"
                          for n, v in row["measured"].items())
        need = row["canaries_needed"]
        lines.append(f"| {row['claim']} | {unit} | {row['paper_effect']:.4g} | {shown} | "
                     f"{'n/a' if at_n is None else f'{at_n:.4g}'} | "
                     f"{'n/a' if at_n is None else ('yes' if row['paper_effect'] >= at_n else 'no')} | "
                     f"{need if need is not None else 'none (the fit stays above it)'} |")
    return "\n".join(lines)
