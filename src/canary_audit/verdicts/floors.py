"""How a detection floor scales with the number of canaries, and the n at
which a paper's effect would clear it.

A run's `detection_floor` table gives, per paper B claim, the smallest share
of its n canaries that a diluted plant must touch for the detector to read
the claim (`floor_share`), and the claim's effect there in the paper's unit
(`floor_effect`).  Measured at two or more n (the default's 20,
configs/floor80.yaml's 80), the floor is fitted as a power law `c * n**p`
(positive at every n; through two n it is exact at both, and its exponent
says how the floor scales: -0.5 where a CI's width sets it, -1 where a
fixed number of canaries does).  The n a paper's effect needs is where the
fit falls to it: an extrapolation beyond the n measured, and it ignores
the verdicts' fixed threshold, below which no floor can fall.

The measured floors are stored with the package (`verdicts/floors.json`, written by
`python -m canary_audit floors --tables ... --store`) so `plan` can say,
before any run, which claims a config's n could see.  The fit rests on a
grid of shares (controls.FLOOR_SHARES): a floor is known to one grid step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl

from canary_audit.data.planted_controls import FLOOR_COMPOSED
from canary_audit.verdicts.claims import paper_claims
from canary_audit.verdicts.measures import MEASURES
from canary_audit.views.table import read_table

FLOORS_FILE = Path(__file__).with_name("floors.json")
CONSTRUCTION = "composed"  # the construction every claim with a floor has (verdicts/controls.py)


def measured(tables: list[Path]) -> list[dict]:
    """Per claim and n: the floor each run's detection_floor table gives
    (composed dilutions; the least sensitive model), and the run it is from."""
    points = []
    for folder in map(Path, tables):
        frame = read_table(folder / "detection_floor.csv")
        if frame is None:
            raise ValueError(f"{folder}: no detection_floor table (a run with `controls.detection_floor` on has one)")
        provenance = folder / "provenance.csv"
        versions = sorted(set(pl.read_csv(provenance)["code_version"])) if provenance.is_file() else []
        frame = frame.filter(pl.col("construction") == CONSTRUCTION)
        for (claim,), part in frame.group_by("claim", maintain_order=True):
            worst = part.sort("floor_share", nulls_last=True).row(-1, named=True)
            points.append({"claim": claim, "canaries": int(part["canaries"][0]),
                           "floor_share": worst["floor_share"], "floor_effect": worst["floor_effect"],
                           "results": folder.parent.name, "code_versions": versions})
    return sorted(points, key=lambda p: (p["claim"], p["canaries"]))


def fit(points: list[dict], unit: str) -> tuple[float, float] | None:
    """(c, p) of the power law `c * n**p` through the points' floors in
    `unit` (floor_share or floor_effect), least squares in log-log over two
    or more n (through two n: exact at both); None where fewer than two n
    have a positive floor."""
    pairs = [(math.log(p["canaries"]), math.log(p[unit])) for p in points if p.get(unit) and p[unit] > 0]
    if len({x for x, _ in pairs}) < 2:
        return None
    mx, my = sum(x for x, _ in pairs) / len(pairs), sum(y for _, y in pairs) / len(pairs)
    slope = sum((x - mx) * (y - my) for x, y in pairs) / sum((x - mx) ** 2 for x, _ in pairs)
    return math.exp(my - slope * mx), slope


def at(coefficients: tuple[float, float], n: int) -> float:
    c, p = coefficients
    return c * n ** p


def needed(coefficients: tuple[float, float] | None, effect: float) -> int | None:
    """The smallest n whose fitted floor is at or below `effect`; None
    where the floor does not fall with n (p >= 0) and is above it, or there
    is no fit."""
    if coefficients is None or effect <= 0:
        return None
    c, p = coefficients
    if p >= 0:
        return 1 if c <= effect else None
    n = max(1, math.ceil((effect / c) ** (1 / p) - 1e-9))
    return n if at(coefficients, n) <= effect else n + 1


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
                     "fit": None if coefficients is None else {"c": coefficients[0], "p": coefficients[1]},
                     "canaries_needed": needed(coefficients, effect),
                     "from": sorted({p["results"] for p in mine})})
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
    lines = [f"Detection floors (a power law c * n**p fitted to {data.get('run') or 'the stored runs'}; a floor "
             f"is known to one step of the share grid) at this config's {n_canaries} hex canaries:", "",
             "| claim | unit | paper's effect | measured floors (n: floor) | p | floor at this n | visible here | "
             "canaries needed |", "|---|---|---|---|---|---|---|---|"]
    for row in data["claims"]:
        fitted = row["fit"]
        at_n = None if fitted is None else at((fitted["c"], fitted["p"]), n_canaries)
        unit = "share of canaries" if row["unit"] == "floor_share" else "effect (paper's unit)"
        shown = ", ".join(f"{n}: {v:.4g}" if v is not None else f"{n}: none read"
                          for n, v in row["measured"].items())
        need = row["canaries_needed"]
        need = need if need is not None else "none" if fitted else "unknown (no floor at two n)"
        exponent = "n/a" if fitted is None else f"{fitted['p']:.2f}"
        lines.append(f"| {row['claim']} | {unit} | {row['paper_effect']:.4g} | {shown} | {exponent} | "
                     f"{'n/a' if at_n is None else f'{at_n:.4g}'} | "
                     f"{'n/a' if at_n is None else ('yes' if row['paper_effect'] >= at_n else 'no')} | "
                     f"{need} |")
    return "\n".join(lines)


def floors_report(tables: list[Path], run: str = "", keep: bool = False) -> tuple[str, dict]:
    """The detection floors of finished runs (their tables folders), how they
    scale with n and the n each paper claim needs, as printed; with `keep`
    they are stored for `plan` (FLOORS_FILE).  A folder without a
    detection_floor table is refused, naming the setting that makes one."""
    for folder in tables:
        if not (folder / "detection_floor.csv").is_file():
            raise FileNotFoundError(f"`{folder}` has no detection_floor.csv: give the tables folder of a run with "
                                    "`controls.detection_floor: true`")
    points = measured(tables)
    data = store(tables, run=run) if keep else {"run": run, "points": points, "claims": summary(points)}
    text = "".join(render(data, n) + "\n\n" for n in sorted({p["canaries"] for p in points}))
    return text, {"points": len(points), "stored": str(FLOORS_FILE) if keep else None}
