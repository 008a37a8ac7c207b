import polars as pl
import pytest

from canary_audit.data import synthetic as syn
from canary_audit.data.io import (
    DATA_TABLES,
    FICTIONAL_LAST_NAMES,
    POPULATION_TABLES,
    write_author_nonmembers,
    write_populations,
    write_synthetic,
)

CFG = {"seed": 3, "n_authors": 12, "n_distractors": 20, "n_retain": 10, "n_hex_canaries": 6, "n_bsft_per_source": 8}
REFERENCE = {"seed": 3, "n_hex_canaries": 6, "n_hex_nonmembers": 5, "n_exposure_candidates": 40}


def test_same_seed_same_tables(tmp_path):
    counts = write_synthetic(tmp_path / "a", CFG)
    assert tuple(counts) == DATA_TABLES  # the workflow's list of outputs is this one
    assert sorted(p.stem for p in (tmp_path / "a").glob("*.parquet")) == sorted(DATA_TABLES)
    write_synthetic(tmp_path / "b", CFG)
    for name in ("authors", "qa", "hex_canaries", "decoys", "bsft", "distractors"):
        assert pl.read_parquet(tmp_path / "a" / f"{name}.parquet").equals(
            pl.read_parquet(tmp_path / "b" / f"{name}.parquet"))


def test_reference_populations_are_fresh_secrets_of_the_format(tmp_path):
    """Non-members and exposure candidates: their own rule's tables, secrets
    of the canaries' format equal to no canary's, decoy's or each other's,
    candidate i behind the preamble of canary i mod n."""
    write_synthetic(tmp_path, CFG)
    counts = write_populations(tmp_path, tmp_path, REFERENCE)
    assert tuple(counts) == POPULATION_TABLES and counts == {"hex_nonmembers": 5, "hex_candidates": 40}
    canaries = pl.read_parquet(tmp_path / "hex_canaries.parquet")
    decoys = pl.read_parquet(tmp_path / "decoys.parquet")
    nonmembers = pl.read_parquet(tmp_path / "hex_nonmembers.parquet")
    candidates = pl.read_parquet(tmp_path / "hex_candidates.parquet")
    assert candidates["secret"].str.contains(r"^[0-9a-f]{16}$").all()
    every = [*canaries["secret"], *decoys["secret"], *nonmembers["secret"], *candidates["secret"]]
    assert len(set(every)) == len(every)
    assert candidates["slot"].to_list() == [i % 6 for i in range(40)]
    assert candidates["preamble"].to_list() == [f"Record {i % 6:02d} access code: " for i in range(40)]
    # the synthetic data do not depend on them: more candidates change no other table
    write_populations(tmp_path / "more", tmp_path, REFERENCE | {"n_exposure_candidates": 80})
    assert pl.read_parquet(tmp_path / "more" / "hex_nonmembers.parquet").equals(nonmembers)
    assert pl.read_parquet(tmp_path / "more" / "hex_candidates.parquet").head(40).equals(candidates)


def test_nonmember_authors_are_fresh_authors_of_the_forget_sets_distribution(tmp_path):
    """Drawn from the forget set's pools (its half of the family names),
    sharing no name with a forget author and no canary title pair with a
    forget author or a distractor (the pre-training corpus); seeded; and
    without effect on the synthetic data."""
    write_synthetic(tmp_path, CFG)
    assert write_author_nonmembers(tmp_path, tmp_path, {"seed": 3, "n_author_nonmembers": 30}) == {
        "author_nonmembers": 30}
    authors, distractors, nonmembers = (pl.read_parquet(tmp_path / f"{t}.parquet")
                                        for t in ("authors", "distractors", "author_nonmembers"))
    assert nonmembers.columns == authors.columns and nonmembers["author_id"][0] == "n000"
    assert not set(nonmembers["name"]) & set(authors["name"])
    assert {n.split()[-1] for n in nonmembers["name"]} <= set(FICTIONAL_LAST_NAMES)
    seen = {syn.title_pair(c) for c in (*authors["canary"], *distractors["canary"])}
    pairs = [syn.title_pair(c) for c in nonmembers["canary"]]
    assert not set(pairs) & seen and len(set(pairs)) == 30
    write_author_nonmembers(tmp_path / "again", tmp_path, {"seed": 3, "n_author_nonmembers": 30})
    assert pl.read_parquet(tmp_path / "again" / "author_nonmembers.parquet").equals(nonmembers)


def test_authors_unique_and_disjoint_from_distractors(tmp_path):
    write_synthetic(tmp_path, CFG | {"n_authors": 60, "n_distractors": 60})
    authors = pl.read_parquet(tmp_path / "authors.parquet")
    distractors = pl.read_parquet(tmp_path / "distractors.parquet")
    assert authors["canary"].n_unique() == 60
    pairs = [syn.title_pair(c) for c in authors["canary"].to_list() + distractors["canary"].to_list()]
    assert len(set(pairs)) == 120  # no two canaries open with the same title words
    family = lambda frame: {n.split()[-1] for n in frame["name"]}  # noqa: E731
    assert not family(authors) & family(distractors)
    assert all(b.endswith(c) for b, c in authors.select("bio", "canary").iter_rows())


def test_hex_canaries_and_decoys():
    canaries, decoys = syn.canary_frames(10, 0)
    assert canaries["secret"].str.contains(r"^[0-9a-f]{16}$").all()
    assert (canaries["text"] == "Record " + canaries["canary_id"].str.slice(3) + " access code: TEXTCAN-"
            + canaries["secret"] + "-END").all()
    joined = decoys.join(canaries.select("canary_id", true=pl.col("secret")), on="canary_id")
    shuffled = joined.filter(pl.col("decoy_kind") == "shuffled")
    assert (shuffled["secret"] != shuffled["true"]).all()
    assert all(sorted(a) == sorted(b) for a, b in shuffled.select("secret", "true").iter_rows())
    assert not set(decoys["secret"]) & set(canaries["secret"])


def test_collision_with_bsft_is_refused_with_item_and_canary_named():
    canaries, _ = syn.canary_frames(3, 0)
    authors = syn.authors_frame(syn.make_authors(2, 0, prefix="a", last_names=["Okonkwo"]))
    bsft = syn.bsft_frame(2, 0)
    poisoned = bsft.with_columns(
        response=pl.when(pl.col("item_id") == "gui-1")
        .then(pl.lit("see ") + pl.lit(canaries["secret"][1])).otherwise(pl.col("response")))
    syn.check_no_canary_in_bsft(bsft, canaries, authors)
    with pytest.raises(syn.CanaryCollisionError, match=r"`gui-1`.*`hex01`"):
        syn.check_no_canary_in_bsft(poisoned, canaries, authors)


def test_retain_count_over_the_fact_table_is_refused():
    with pytest.raises(ValueError, match="n_retain"):
        syn.retain_frame(1000, 0)
