"""Claims on the one-run audit bound (views/audit_bound.py), which the
judge reads apart from every other value claim: a lower bound is judged
against a stated epsilon only, from one row of the `audit_bound` table.

One variant reads its own row.  The variants of one family under every
seed it ran read the family's pooled row: each training seed draws its own
coins (data/inclusion.py), so the seeds are independent runs and together
one mechanism over all their candidates.  Any other selection is refused,
as is a comparison with another variant: a lower bound bounds nothing
above it.
"""

from __future__ import annotations

from collections.abc import Callable

from canary_audit.verdicts import evidence
from canary_audit.verdicts.claims import Claim
from canary_audit.verdicts.decision import Claimed
from canary_audit.verdicts.evidence import Evidence
from canary_audit.verdicts.readings import Run
from canary_audit.views.seeds import family_of


def bound_evidence(run: Run, claim: Claim, claimed: Claimed, table: str, names: list[str], fields: dict,
                   row_of: Callable[[str], dict | None]) -> Evidence | str:
    """The evidence of a claim on the bound over the selected `names`, or
    why it is not testable; `row_of` finds a variant's (or a family's)
    row of `table`."""
    pooled = pooled_family(run, names, fields)
    if len(names) > 1 and pooled is None:
        return (f"the one-run bound is per training run or per family of seeds, and the {len(names)} selected "
                f"({', '.join(names)}) are neither one variant nor one variant under each of its seeds; "
                "narrow the selection")
    if not isinstance(claim.compare, int | float) or isinstance(claim.compare, bool):
        return (f"`compare: {claim.compare}`: a bound is judged against a stated epsilon (a number); another "
                "variant's lower bound bounds nothing above it")
    name = pooled or names[0]
    row = row_of(name)
    if row is None or row.get("epsilon_lower") is None:
        return f"no `{table}` row for {name} (built under `data.inclusion` or `data.hex_inclusion: coin` only)"
    seeds = [fields[n].get("seed") for n in names]
    label = "+".join(f"s{s}" for s in seeds) if None not in seeds else names[0]
    return evidence.from_bound(row, claimed, label, f"{table}: {name}")


def pooled_family(run: Run, names: list[str], fields: dict) -> str | None:
    """The family `names` make up when they are one variant under every
    seed its family ran (Run.seeds_of), two or more: the name of its pooled
    bound row; else None."""
    seeds = [fields[n].get("seed") for n in names]
    if len(names) < 2 or None in seeds or sorted(names) != sorted(run.seeds_of(names[0])):
        return None
    return family_of(names[0], seeds[0])
