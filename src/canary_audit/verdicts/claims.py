"""What a claim is, as a researcher writes it (the config's `claims:` block or
a claim file) and as the papers' shipped files write theirs
(paper_a.yaml, paper_b.yaml): parsed and checked key by key, and the
variants its selector picks.  Judging it is verdicts/judge.py."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from canary_audit.verdicts.measures import MEASURES
from canary_audit.views.seeds import family_of

SELECTOR_KEYS = ("variant", "model", "kind", "method", "run", "template", "k", "seed", "apply", "cell", "source",
                 "step", "application", "quantize", "relearn", "relearn_steps")
EXPECTATIONS = ("higher", "lower")
KEYS = ("id", "sentence", "measure", "variants", "where", "compare", "expect", "effect", "equivalence", "paper",
        "effect_share", "effect_size")
PAPER_KEYS = ("name", "values", "text", "where", "ci", "n")
PAPER_FILES = tuple(Path(__file__).with_name(f"paper_{p}.yaml") for p in ("a", "b"))


class ClaimError(ValueError):
    """A claim that cannot be judged as written: names the key and the fix."""


@dataclass(frozen=True)
class Claim:
    id: str
    sentence: str
    measure: str
    variants: dict = field(default_factory=dict)
    where: dict = field(default_factory=dict)
    compare: object = None  # number | "parent" | "reference" | {"variants": selector}
    expect: object = None   # "higher" | "lower" | {"value", "tolerance"} | "read"
    paper: dict | None = None  # the paper's own values (numbers, per component), its phrasing, where, its CI and n
    effect_share: float | None = None
    effect_size: float | None = None
    effect: float | None = None  # the effect of interest, on the judged number's scale (a Delta for `parent`)
    equivalence: float | None = None  # a band +- this about the null where no effect matters (TOST)

    @property
    def key(self) -> str:
        return f"claims.{self.id}"


def parse(entries, origin: str = "claims") -> list[Claim]:
    """Claims from a list of mappings (a file's or the config's), each
    checked on its own: keys, measure, comparison, expectation."""
    if isinstance(entries, dict) and "claims" in entries:
        entries = entries["claims"]
    if not isinstance(entries, list):
        raise ClaimError(f"`{origin}` holds {type(entries).__name__}: give a list of claims, each with id, sentence, "
                         "measure, variants and expect")
    out, seen = [], set()
    for i, entry in enumerate(entries):
        where = f"{origin}[{i}]"
        if not isinstance(entry, dict) or not entry.get("id"):
            raise ClaimError(f"`{where}` has no `id`: give each claim an id")
        where = f"claims.{entry['id']}"
        if entry["id"] in seen:
            raise ClaimError(f"`{where}` is declared twice: give each claim its own id")
        seen.add(entry["id"])
        extra = sorted(set(entry) - set(KEYS))
        if extra:
            raise ClaimError(f"`{where}` has unknown keys {extra}: a claim takes {', '.join(KEYS)}")
        for key in ("sentence", "measure"):
            if not entry.get(key):
                raise ClaimError(f"`{where}.{key}` is missing: say the {key} the claim tests")
        claim = Claim(entry["id"], entry["sentence"], entry["measure"], dict(entry.get("variants") or {}),
                      dict(entry.get("where") or {}), entry.get("compare"), entry.get("expect"), entry.get("paper"),
                      entry.get("effect_share"), entry.get("effect_size"), entry.get("effect"),
                      entry.get("equivalence"))
        check(claim)
        out.append(claim)
    return out


def load(path: Path) -> list[Claim]:
    path = Path(path)
    if not path.is_file():
        raise ClaimError(f"claim file `{path}` does not exist: give the path of a YAML list of claims")
    return parse(yaml.safe_load(path.read_text()), str(path))


def paper_claims() -> list[Claim]:
    """The papers' claims, paper A's then paper B's (the shipped files)."""
    return [c for path in PAPER_FILES for c in load(path)]


def check(claim: Claim) -> None:
    """Refuse what no run could judge: an unknown measure or selector key, a
    comparison the measure cannot make, a missing or unknown expectation."""
    if claim.measure not in MEASURES:
        raise ClaimError(f"`{claim.key}.measure` is `{claim.measure}`: no such measure; registered: "
                         f"{', '.join(MEASURES)}")
    measure = MEASURES[claim.measure]
    bad = sorted(set(claim.variants) - set(SELECTOR_KEYS))
    if bad:
        raise ClaimError(f"`{claim.key}.variants` selects on {bad}: a selector takes {', '.join(SELECTOR_KEYS)}")
    bad = sorted(set(claim.where) - set(measure.where))
    if bad:
        raise ClaimError(f"`{claim.key}.where` sets {bad}: measure `{measure.name}` reads rows by "
                         f"{', '.join(measure.where) or 'nothing'}")
    _check_effects(claim, measure)
    if claim.paper is not None:
        _check_paper(claim)
    if measure.read is not None:
        if claim.compare is not None:
            raise ClaimError(f"`{claim.key}.compare`: measure `{measure.name}` is a reading that judges its own "
                             "effect; drop `compare`")
        if claim.expect != "read":
            raise ClaimError(f"`{claim.key}.expect` is {claim.expect!r}: reading measure `{measure.name}` expects "
                             "`read` (the effect it defines is read)")
        return
    if claim.expect is None:
        raise ClaimError(f"`{claim.key}.expect` is missing: say the direction the claim expects (higher, lower) or "
                         "a value with a tolerance ({value: 0.0, tolerance: 0.05})")
    if isinstance(claim.expect, dict):
        if set(claim.expect) != {"value", "tolerance"} or not all(
                isinstance(v, int | float) for v in claim.expect.values()) or claim.expect["tolerance"] < 0:
            raise ClaimError(f"`{claim.key}.expect` is {claim.expect}: give {{value: <number>, tolerance: <number "
                             ">= 0>}}")
    elif claim.expect not in EXPECTATIONS:
        raise ClaimError(f"`{claim.key}.expect` is {claim.expect!r}: expect higher, lower or "
                         "{value: <number>, tolerance: <number>}")
    compare = claim.compare
    if isinstance(compare, dict):
        if set(compare) != {"variants"} or not isinstance(compare["variants"], dict):
            raise ClaimError(f"`{claim.key}.compare` is {compare}: compare with {{variants: <selector>}}")
    elif compare is None:
        if not isinstance(claim.expect, dict):
            raise ClaimError(f"`{claim.key}.compare` is missing: `{claim.expect}` than what? a number, parent, "
                             "reference or {variants: <selector>}")
    elif not isinstance(compare, int | float) and compare not in ("parent", "reference"):
        raise ClaimError(f"`{claim.key}.compare` is {compare!r}: compare with a number, parent, reference or "
                         "{variants: <selector>}")


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_effects(claim: Claim, measure) -> None:
    """A stated effect is used or refused, never ignored: `effect_share` and
    `effect_size` bound a reading that has a detection floor, `effect` and
    `equivalence` a value measure's number."""
    for key in ("effect_share", "effect_size", "effect", "equivalence"):
        value = getattr(claim, key)
        if value is not None and not _number(value):
            raise ClaimError(f"`{claim.key}.{key}` is {value!r}: give a number")
    floored = [k for k in ("effect_share", "effect_size") if getattr(claim, k) is not None]
    if floored and not measure.floor:
        with_floor = ", ".join(m.name for m in MEASURES.values() if m.floor)
        raise ClaimError(f"`{claim.key}.{floored[0]}`: measure `{measure.name}` has no detection floor to compare it "
                         f"with (only {with_floor} have one); for a value measure state `effect`, the value you expect")
    valued = [k for k in ("effect", "equivalence") if getattr(claim, k) is not None]
    if valued and measure.read is not None:
        raise ClaimError(f"`{claim.key}.{valued[0]}`: measure `{measure.name}` is a reading that judges its own "
                         "effect; a reading with a detection floor takes effect_share or effect_size")
    if claim.equivalence is not None and claim.equivalence <= 0:
        raise ClaimError(f"`{claim.key}.equivalence` is {claim.equivalence}: give the half-width (> 0) of the band "
                         "about the comparison where no effect matters")
    if claim.equivalence is not None and isinstance(claim.expect, dict):
        raise ClaimError(f"`{claim.key}.equivalence`: a claim expecting a value within a tolerance is itself an "
                         "equivalence claim; drop `equivalence`")


def _check_paper(claim: Claim) -> None:
    """A paper's values are numbers, one per component, its phrasing apart."""
    paper = claim.paper
    if not isinstance(paper, dict) or not paper.get("name"):
        raise ClaimError(f"`{claim.key}.paper` is {paper!r}: give name, values (component: number), text, where")
    extra = sorted(set(paper) - set(PAPER_KEYS))
    if extra:
        raise ClaimError(f"`{claim.key}.paper` has unknown keys {extra}: it takes {', '.join(PAPER_KEYS)}")
    values = paper.get("values")
    if not isinstance(values, dict) or not values or not all(_number(v) for v in values.values()):
        raise ClaimError(f"`{claim.key}.paper.values` is {values!r}: give each component the paper reports as a "
                         "number (e.g. {gap: 0.23})")
    ci = paper.get("ci")
    if ci is not None and not (isinstance(ci, list) and len(ci) == 2 and all(_number(v) for v in ci)):
        raise ClaimError(f"`{claim.key}.paper.ci` is {ci!r}: give [low, high] of the paper's reported 95% CI")


def fields_of(variants: dict[str, dict], cells: dict[str, dict]) -> dict[str, dict]:
    """Each variant's selectable fields: its own and its bSFT cell's."""
    return {name: {**v, **cells.get(name, {}), "variant": name} for name, v in variants.items()}


def select(fields: dict[str, dict], selector: dict) -> list[str]:
    """The variants a selector matches, ordered by model, seed and largest K
    first (`k: max`: only the largest K of each run, template and seed)."""
    wanted = {k: v for k, v in selector.items() if not (k == "k" and v == "max")}
    found = [n for n, f in fields.items() if all(f.get(k) == v for k, v in wanted.items())]
    if selector.get("k") == "max":
        top: dict[tuple, int] = {}
        for n in found:
            f = fields[n]
            if f.get("k") is not None:
                key = (f.get("model"), f.get("run"), f.get("template"), f.get("seed"))
                top[key] = max(top.get(key, f["k"]), f["k"])
        found = [n for n in found if fields[n].get("k") is not None and fields[n]["k"] == top[
            (fields[n].get("model"), fields[n].get("run"), fields[n].get("template"), fields[n].get("seed"))]]
    return sorted(found, key=lambda n: (fields[n].get("model") or "", fields[n].get("seed") or 0,
                                        -(fields[n].get("k") or 0), n))


def one_family(claim: Claim, names: list[str], fields: dict[str, dict]) -> None:
    """Refuse a claim's `variants` that select more than one variant per
    seed (a checkpoint beside its quantized copies, say): one value would
    stand for several models."""
    families = {family_of(n, fields[n]["seed"]) if fields[n].get("seed") is not None else n for n in names}
    if len(families) > 1:
        raise ClaimError(f"`{claim.key}.variants` {claim.variants} selects {len(families)} variants per seed "
                         f"({', '.join(sorted(families)[:4])}); narrow it (e.g. kind, k, run, template or variant)")


def check_selectors(claims: list[Claim], fields: dict[str, dict]) -> None:
    """Refuse, before any job, a selector (of `variants` or of a compared
    selector) that matches no variant the config makes, naming the nearest,
    and `variants` that select several per seed."""
    for claim in claims:
        selectors = [("variants", claim.variants)]
        if isinstance(claim.compare, dict):
            selectors.append(("compare.variants", claim.compare["variants"]))
        for key, selector in selectors:
            names = select(fields, selector)
            if names:
                if key == "variants":
                    one_family(claim, names, fields)
                continue
            for field_name, value in selector.items():
                values = sorted({str(f.get(field_name)) for f in fields.values() if f.get(field_name) is not None})
                if field_name != "k" or value != "max":
                    if str(value) not in values:
                        near = difflib.get_close_matches(str(value), values, n=3, cutoff=0.3) or values[:8]
                        raise ClaimError(f"`{claim.key}.{key}.{field_name}` is {value!r}: no variant this config "
                                         f"makes has it; nearest: {', '.join(near) or 'none'}")
            score = {n: sum(f.get(k) == v for k, v in selector.items()) for n, f in fields.items()}
            near = sorted(score, key=lambda n: (-score[n], n))[:5]
            raise ClaimError(f"`{claim.key}.{key}` {selector} matches no variant this config makes; nearest: "
                             f"{', '.join(near)}")
