"""Randomized inclusion of the forget set (data/inclusion.py): fair seeded
coins over one generator's candidates, the members in authors.parquet and
the rest as the author non-members, the fixed default unchanged, and the
design reading the same coins (counts, a relearning's share, refusals)."""

from __future__ import annotations

import polars as pl
import pytest
from test_design import config_of, design_of

from canary_audit.data import synthetic as syn
from canary_audit.data.inclusion import COIN, coins, included, members, nonmembers
from canary_audit.data.io import FICTIONAL_LAST_NAMES, write_author_nonmembers, write_synthetic

CFG = {"seed": 3, "n_authors": 16, "n_distractors": 20, "n_retain": 10, "n_hex_canaries": 6, "n_bsft_per_source": 8,
       "n_author_nonmembers": 0}


def test_the_coins_are_fair_seeded_and_refused_when_all_fall_alike():
    assert coins(40, 0) == coins(40, 0) and coins(40, 0) != coins(40, 1)
    share = sum(sum(coins(40, s)) for s in range(200)) / (40 * 200)
    assert abs(share - 0.5) < 0.02  # 8,000 fair coins: 3.5 standard errors of 0.0056
    degenerate = next(s for s in range(100) if len(set(
        __import__("random").Random(f"inclusion:author:{s}").random() < 0.5 for _ in range(2))) == 1)
    with pytest.raises(ValueError, match=f"all 2 coins of data.seed {degenerate} at training seed 0 fell"):
        coins(2, degenerate)


def test_coin_inclusion_splits_one_generators_candidates_and_fixed_is_as_before(tmp_path):
    fixed = tmp_path / "fixed"
    write_synthetic(fixed, {**CFG, "inclusion": "fixed"})
    pool = syn.make_authors(16, 3, prefix="a", last_names=FICTIONAL_LAST_NAMES)
    assert pl.read_parquet(fixed / "authors.parquet").equals(syn.authors_frame(pool))  # the data as before
    coin = tmp_path / "coin"
    cfg = {**CFG, "inclusion": COIN}
    write_synthetic(coin, cfg)
    write_author_nonmembers(coin, coin, cfg)
    kept = pl.read_parquet(coin / "authors.parquet")
    rest = pl.read_parquet(coin / "author_nonmembers.parquet")
    flags = coins(16, 3)
    assert kept["author_id"].to_list() == [a.author_id for a, m in zip(pool, flags) if m]
    assert rest["author_id"].to_list() == [a.author_id for a, m in zip(pool, flags) if not m]
    assert kept.vstack(rest).sort("author_id").equals(syn.authors_frame(pool))  # one generator's candidates
    qa = pl.read_parquet(coin / "qa.parquet")
    assert set(qa["author_id"]) == set(kept["author_id"])  # only members are trained on
    assert (members(cfg), nonmembers(cfg)) == (kept.height, rest.height)


def test_each_training_seed_draws_its_own_coins_and_its_own_data_folder(tmp_path):
    """Seed 0 keeps the data seed's draw (the runs before the redraw); each
    further seed draws anew from the same candidates.  A seed's folder holds
    its members (authors, their QA) and the rest as non-members, every
    other table the data folder's own; `fixed` has no such folder."""
    from canary_audit.data.io import SEED_TABLES, write_seed_data

    cfg = {**CFG, "inclusion": COIN}
    assert included(cfg, 0) == coins(16, 3) == included(cfg)
    draws = [included(cfg, s) for s in range(4)]
    assert len({tuple(d) for d in draws}) == 4  # four seeds, four draws of 16 coins
    data = tmp_path / "data"
    write_synthetic(data, cfg)
    write_author_nonmembers(data, data, cfg)
    for table in ("hex_nonmembers", "hex_candidates"):  # the populations, as rule populations writes them
        pl.DataFrame({"secret": [table]}).write_parquet(data / f"{table}.parquet")
    write_seed_data(tmp_path / "s0", data, {**cfg, "train_seed": 0})
    counts = write_seed_data(tmp_path / "s2", data, {**cfg, "train_seed": 2})
    for table in SEED_TABLES:  # seed 0's folder is the data folder's split
        assert pl.read_parquet(tmp_path / "s0" / f"{table}.parquet").equals(pl.read_parquet(data / f"{table}.parquet"))
    kept = pl.read_parquet(tmp_path / "s2" / "authors.parquet")
    rest = pl.read_parquet(tmp_path / "s2" / "author_nonmembers.parquet")
    pool = syn.make_authors(16, 3, prefix="a", last_names=FICTIONAL_LAST_NAMES)
    assert kept["author_id"].to_list() == [a.author_id for a, m in zip(pool, draws[2]) if m]
    assert kept.vstack(rest).sort("author_id").equals(syn.authors_frame(pool))  # the same candidates
    assert set(pl.read_parquet(tmp_path / "s2" / "qa.parquet")["author_id"]) == set(kept["author_id"])
    assert counts["authors"] == members(cfg, 2) and counts["author_nonmembers"] == nonmembers(cfg, 2)
    assert pl.read_parquet(tmp_path / "s2" / "retain.parquet").equals(pl.read_parquet(data / "retain.parquet"))
    with pytest.raises(ValueError, match="under `data.inclusion: coin` only"):
        write_seed_data(tmp_path / "f", data, {**CFG, "inclusion": "fixed", "train_seed": 1})


def test_each_seeds_jobs_read_its_folder_and_a_job_never_mixes_seeds():
    """Under coin inclusion a memorization group reads its seed's folder,
    the base's the data folder, paper A's plants split by seed, and a
    relearning's share is drawn from its own seed's members; `fixed` reads
    the data folder throughout."""
    from canary_audit.design import ConfigError

    overrides = {"data": {"inclusion": COIN, "n_author_nonmembers": 0, "n_authors": 12},
                 "audit": {"seeds": [0, 1]}, "controls": {"every_seed": True},
                 "recovery": {"unlearned": [{"run": "npo", "template": "bio", "k": "max"}],
                              "relearn": {"data": ["forget"], "steps": [5], "share": 0.25}}}
    design, data = design_of(overrides), config_of(overrides)["data"]
    model = design.config["audit"]["models"][0]
    groups = design.probe_groups(model)
    assert design.data_seed(model, groups["mem-bio-s1"]) == 1 and design.data_seed(model, groups["base"]) is None
    assert design.data_seed(model, groups["controls-s1"]) == 1 and design.data_seed(model, groups["controls"]) == 0
    with pytest.raises(ConfigError, match="under training seeds \\[0, 1\\] in one job"):
        design.data_seed(model, ["mem-bio-s0", "mem-bio-s1"])
    for seed in (0, 1):
        chosen = {a for v in design.variant_table().values() if v.get("seed") == seed
                  for a in (v.get("relearned") or ())}
        assert chosen and chosen <= {f"a{i:03d}" for i, m in enumerate(included(data, seed)) if m}
    fixed = design_of({"audit": {"seeds": [0, 1]}})
    assert fixed.data_seed(model, fixed.probe_groups(model)["mem-bio-s1"]) is None
    assert "controls-s1" not in fixed.probe_groups(model)


def test_hex_coin_inclusion_splits_the_canaries_between_the_lora_and_the_non_members(tmp_path):
    """`data.hex_inclusion: coin`: the canary LoRA's canaries (and their
    decoys) are the ones the coins keep, the hex non-members the rest, each
    behind its own preamble; `fixed` keeps the data and populations as they
    were; the coins are fair and seeded."""
    from canary_audit.data.inclusion import hex_counts, hex_included
    from canary_audit.data.io import write_populations

    cfg = {**CFG, "n_hex_canaries": 24, "n_hex_nonmembers": 0, "n_exposure_candidates": 0}
    every, every_decoys = syn.canary_frames(24, 3)
    fixed = tmp_path / "fixed"
    write_synthetic(fixed, {**cfg, "hex_inclusion": "fixed"})
    assert pl.read_parquet(fixed / "hex_canaries.parquet").equals(every)
    coin_cfg = {**cfg, "hex_inclusion": COIN}
    flags = hex_included(coin_cfg)
    coin = tmp_path / "coin"
    write_synthetic(coin, coin_cfg)
    write_populations(coin, coin, coin_cfg)
    kept = pl.read_parquet(coin / "hex_canaries.parquet")
    rest = pl.read_parquet(coin / "hex_nonmembers.parquet")
    assert kept["canary_id"].to_list() == [c for c, m in zip(every["canary_id"], flags) if m]
    assert rest["canary_id"].to_list() == [c for c, m in zip(every["canary_id"], flags) if not m]
    assert kept.vstack(rest.select(kept.columns)).sort("canary_id").equals(every)  # one generator's candidates
    assert set(pl.read_parquet(coin / "decoys.parquet")["canary_id"]) == set(kept["canary_id"])
    assert hex_counts(coin_cfg) == (kept.height, rest.height) and hex_counts({**cfg, "n_hex_nonmembers": 9}) == (24, 9)
    share = sum(sum(hex_included({**coin_cfg, "seed": s, "n_hex_canaries": 40})) for s in range(100)) / 4000
    assert abs(share - 0.5) < 0.03  # 4,000 fair coins: 3.9 standard errors of 0.0079


@pytest.mark.parametrize("override,key", [
    ({"data": {"n_hex_nonmembers": 100}}, "data.n_hex_nonmembers"),
    ({"data": {"n_exposure_candidates": 1000}}, "data.n_exposure_candidates"),
    ({"bsft": {"sources": ["synth"]}}, "bsft.sources"),
    ({"audit": {"models": ["tiny", "tiny_vl"]}}, "audit.models"),
])
def test_hex_coin_inclusion_refuses_what_counts_every_canary_as_trained(override, key):
    from canary_audit.core.config_merge import merge
    from canary_audit.design import ConfigError

    base = {"data": {"hex_inclusion": COIN, "n_hex_nonmembers": 0, "n_exposure_candidates": 0},
            "audit": {"models": ["tiny"]}, "bsft": {"sources": [], "controls": {"undertrained": {"sources": []},
                                                                                 "noise": {"sources": []}}}}
    design_of(base)  # the audit config's turn-offs: accepted
    with pytest.raises(ConfigError, match=f"`{key}` is set against hex coin inclusion"):
        design_of(merge(base, override))


def test_the_design_refuses_a_fixed_population_beside_the_coins_and_draws_relearning_from_members():
    from canary_audit.design import ConfigError

    with pytest.raises(ConfigError, match="`data.n_author_nonmembers` is 100, but `data.inclusion: coin`"):
        design_of({"data": {"inclusion": COIN, "n_author_nonmembers": 100}})
    data = config_of({"data": {"inclusion": COIN, "n_author_nonmembers": 0, "n_authors": 12}})["data"]
    design = design_of({"data": {"inclusion": COIN, "n_author_nonmembers": 0, "n_authors": 12},
                        "recovery": {"unlearned": [{"run": "npo", "template": "bio", "k": "max"}],
                                     "relearn": {"data": ["forget"], "steps": [5], "share": 0.25}}})
    relearned = {a for v in design.variant_table().values() for a in (v.get("relearned") or ())}
    member_ids = {f"a{i:03d}" for i, m in enumerate(included(data)) if m}
    assert relearned and relearned <= member_ids


def test_the_plan_counts_the_members_the_coins_kept():
    from canary_audit.design.plan import pass_sequences

    overrides = {"data": {"inclusion": COIN, "n_author_nonmembers": 0, "n_authors": 12}}
    design, data = design_of(overrides), config_of(overrides)["data"]
    model = design.config["audit"]["models"][0]
    group = next(g for g, names in design.probe_groups(model).items() if "mem-bio" in names[0])
    counts = pass_sequences(design, model, group)
    arms = len(design.prefills(group))
    assert counts["greedy_author"] == members(data) * 4 * (1 + arms) + data["n_retain"]
    assert counts["scored_author"] == data["n_authors"] * arms  # every candidate, member or not


def test_docs_figures_of_the_audit_config_are_the_codes():
    """docs/measures.md's members and caps, for the default's 40 candidates
    and configs/audit.yaml's, are what the coins and views/audit_bound give."""
    import yaml
    from conftest import ROOT

    from canary_audit.views.audit_bound import cap, grid_of
    from canary_audit.views.mia import ATTACKS

    text = " ".join((ROOT / "docs" / "measures.md").read_text().split())
    default = config_of()["data"]
    audit = yaml.safe_load((ROOT / "configs" / "audit.yaml").read_text())["data"]["n_authors"]

    def kept(n: int) -> int:
        return members({**default, "n_authors": n, "seed": 0, "inclusion": COIN})

    assert f"({kept(40)} of 40 at data seed 0; configs/audit.yaml's {audit} candidates keep {kept(audit)})" in text
    shares = config_of()["tables"]["audit_bound"]["shares"]

    def searched(n: int) -> float:
        return cap(n, config_of()["tables"]["audit_bound"]["beta"] / (len(grid_of(n, shares)) * len(ATTACKS)))

    assert (f"4 shares and 4 scores at 95%: {searched(40):.2f} for 40 candidates and {searched(audit):.2f} for "
            f"{audit}, against {cap(40):.2f} and {cap(audit):.2f} for one guess fixed in advance") in text
    assert len(shares) == len(ATTACKS) == 4
