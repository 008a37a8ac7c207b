"""What a run could have seen (verdicts/power.py, verdicts/components.py):
the smallest detectable effect from the run's own variance components,
what a stated effect needs in seeds or authors, "needs >= S seeds whatever
the items" where the seed component alone forbids it, and the plan's
statement for a config from stored components."""

from __future__ import annotations

import numpy as np
import pytest

from canary_audit.verdicts import components, power
from canary_audit.verdicts.intervals import crossed


def layout(var_seed: float, var_item: float, seeds: int = 3, items: int = 40, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.normal(0, var_seed ** 0.5, (seeds, 1)) + rng.normal(0, var_item ** 0.5, (1, items))
            + rng.normal(0, 0.3, (seeds, items)))


def test_the_detectable_effect_is_the_two_quantiles_times_the_se():
    """One term (one seed): (t_{0.975} + t_{0.80}) x SE at its df."""
    from scipy import stats

    c = crossed(layout(0.0, 0.5, seeds=1))
    df = c.items - 1
    want = (stats.t.ppf(0.975, df) + stats.t.ppf(0.8, df)) * c.se
    assert power.detectable(c) == pytest.approx(want, rel=1e-9)


def test_more_authors_help_until_the_seeds_dominate():
    item_bound = crossed(layout(0.001, 1.0))
    statement = power.power(item_bound, effect=0.3)
    assert statement.items_needed is not None and statement.items_needed > item_bound.items
    assert "items at 3 seeds" in statement.text and "upper 80% limit" in statement.text
    seed_bound = crossed(layout(4.0, 0.01, seed=1))
    statement = power.power(seed_bound, effect=0.5)
    assert statement.seed_bound and "seeds whatever the items" in statement.text
    assert statement.detectable_upper >= statement.detectable  # the seed component's upper limit


def test_power_is_never_computed_at_the_observed_effect():
    """No statement without a stated effect names one."""
    statement = power.power(crossed(layout(0.1, 0.1)), effect=None)
    assert statement.seeds_needed is None and "no effect of interest stated" in statement.text


def test_the_plan_states_what_a_config_could_see_from_stored_components():
    stored = {"run": "a test", "claims": [{"claim": "a_bypass_gap", "measure": "bypass_gap", "effect": 0.23,
                                           "seeds": 3, "items": 40, "var_seed": 0.02, "var_item": 0.05,
                                           "var_resid": 0.1, "ms_seed": 0.9}]}
    three, ten = components.render(stored, 3, 40), components.render(stored, 10, 200)
    d3 = float(three.splitlines()[-1].split(" | ")[2])
    d10 = float(ten.splitlines()[-1].split(" | ")[2])
    assert d10 < d3 and "a_bypass_gap" in three
    assert "No variance components stored" in components.render(None, 3, 40)
