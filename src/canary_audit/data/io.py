"""Writing and reading the synthetic data set (Parquet, one file per table)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from canary_audit.core.records import write_parquet_atomic
from canary_audit.data import pools
from canary_audit.data import synthetic as syn
from canary_audit.data.inclusion import FIXED, hex_included, included, per_seed
from canary_audit.data.relearn import FORGET_PREFIX

# The tables the data rule writes, in the order the workflow lists them.
DATA_TABLES = ("authors", "qa", "retain", "hex_canaries", "decoys", "bsft", "distractors", "pretrain_bsft")
# The reference populations of the hex canaries, which no adapter trains on
# and only the teacher-forced pass scores: non-member records (membership
# inference) and exposure candidates.  A rule of their own writes them, so
# adding some re-runs only the passes that score them.
POPULATION_TABLES = ("hex_nonmembers", "hex_candidates")
# The data settings each rule reads (the rest of `data:` is the synthetic data's).
POPULATION_KEYS = ("seed", "n_hex_canaries", "n_hex_nonmembers", "n_exposure_candidates")
VISION_KEYS = ("seed", "n_image_canaries")
IMAGE_NONMEMBER_KEYS = ("seed", "n_hex_nonmembers")  # as many non-member cards as text non-members
# The author canaries' non-members (membership inference's negatives), written
# by a rule of their own for the same reason; read only by passes that score
# the author canaries.
AUTHOR_NONMEMBERS = "author_nonmembers"
AUTHOR_NONMEMBER_KEYS = ("seed", "n_author_nonmembers")
# Family names split between the two populations (see make_authors): the
# fictional authors and their non-members draw from one half, the
# pre-training distractors from the other.
FICTIONAL_LAST_NAMES = pools.LAST_NAMES[0::2]


def synthetic_settings(data: dict) -> dict:
    """The `data:` settings the synthetic data depend on (not the reference
    populations' or the images' own counts; `inclusion` only where it is
    not `fixed`, the data as they were before the option)."""
    own = {*POPULATION_KEYS, *VISION_KEYS, *AUTHOR_NONMEMBER_KEYS} - {"seed", "n_hex_canaries"}
    own |= {key for key in ("inclusion", "hex_inclusion") if data.get(key, FIXED) == FIXED}
    return {k: v for k, v in data.items() if k not in own}


def population_settings(data: dict) -> dict:
    """What the hex populations depend on: their counts and seed, and under
    hex coin inclusion the coins that make the non-members."""
    own = ("hex_inclusion",) if data.get("hex_inclusion", FIXED) != FIXED else ()
    return {k: data[k] for k in (*POPULATION_KEYS, *own)}


def hex_candidates(cfg: dict) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The hex canaries split by their inclusion (data/inclusion.py): the
    trained ones, their decoys, and the rest (each behind its own preamble,
    in the non-members' columns)."""
    canaries, decoys = syn.canary_frames(cfg["n_hex_canaries"], cfg["seed"])
    coin = pl.Series(hex_included(cfg))
    kept = canaries.filter(coin)
    rest = canaries.filter(~coin).select("canary_id", "preamble", "secret", "text")
    return kept, decoys.filter(pl.col("canary_id").is_in(kept["canary_id"].implode())), rest


def author_nonmember_settings(data: dict) -> dict:
    """What the author non-members depend on: their count and seed, and
    under coin inclusion the candidates they are drawn from."""
    keys = AUTHOR_NONMEMBER_KEYS if data.get("inclusion", FIXED) == FIXED else (
        *AUTHOR_NONMEMBER_KEYS, "n_authors", "inclusion")
    return {k: data[k] for k in keys}


def candidates(cfg: dict, train_seed: int = 0) -> tuple[list[syn.Author], list[syn.Author]]:
    """The forget set's candidates split by their inclusion under training
    seed `train_seed` (data/inclusion.py): (members, the rest)."""
    pool = syn.make_authors(cfg["n_authors"], cfg["seed"], prefix=FORGET_PREFIX, last_names=FICTIONAL_LAST_NAMES)
    flags = included(cfg, train_seed)
    return [a for a, m in zip(pool, flags) if m], [a for a, m in zip(pool, flags) if not m]


def write_synthetic(out_dir: Path, cfg: dict) -> dict[str, int]:
    """Generate every table from `cfg` (the `data` config slice); return row counts.

    Fails before writing anything if a canary string occurs in a bSFT source.
    """
    seed = cfg["seed"]
    authors, rest = candidates(cfg)
    distractors = syn.make_authors(
        cfg["n_distractors"], seed, prefix="d", last_names=pools.LAST_NAMES[1::2],
        exclude_titles={syn.title_pair(a.canary) for a in (*authors, *rest)},
    )
    canaries, decoys, rest_canaries = hex_candidates(cfg)
    authors_df = syn.authors_frame(authors)
    tables = {
        "authors": authors_df,
        "qa": syn.qa_frame(authors),
        "retain": syn.retain_frame(cfg["n_retain"], seed),
        "hex_canaries": canaries,
        "decoys": decoys,
        "bsft": syn.bsft_frame(cfg["n_bsft_per_source"], seed),
        "distractors": syn.authors_frame(distractors),
        # bSFT-style text for pre-training comes from another seed, so the
        # bSFT items themselves stay unseen by the base model.
        "pretrain_bsft": syn.bsft_frame(cfg["n_bsft_per_source"], seed + 10_000),
    }
    every_canary = pl.concat([canaries.select(rest_canaries.columns), rest_canaries])  # members or not
    syn.check_no_canary_in_bsft(tables["bsft"], every_canary, syn.authors_frame([*authors, *rest]))
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        write_parquet_atomic(frame, out_dir / f"{name}.parquet")
    return {name: frame.height for name, frame in tables.items()}


def write_populations(out_dir: Path, data_dir: Path, cfg: dict) -> dict[str, int]:
    """The non-member records and the exposure candidates (POPULATION_TABLES),
    none equal to a canary's or decoy's secret, nor to each other.  Under
    hex coin inclusion the non-members are the candidates the coins left
    out (data/inclusion.py), so that they are exchangeable with the members."""
    canaries = pl.read_parquet(data_dir / "hex_canaries.parquet")
    decoys = pl.read_parquet(data_dir / "decoys.parquet")
    taken = set(canaries["secret"]) | set(decoys["secret"])
    if cfg.get("hex_inclusion", FIXED) == FIXED:
        nonmembers = syn.nonmember_frame(cfg["n_hex_nonmembers"], cfg["n_hex_canaries"], cfg["seed"], taken)
    else:
        nonmembers = hex_candidates(cfg)[2]
    candidates = syn.candidate_frame(cfg["n_exposure_candidates"], cfg["n_hex_canaries"], cfg["seed"],
                                     taken | set(nonmembers["secret"]))
    tables = {"hex_nonmembers": nonmembers, "hex_candidates": candidates}
    for name, frame in tables.items():
        write_parquet_atomic(frame, out_dir / f"{name}.parquet")
    return {name: frame.height for name, frame in tables.items()}


def write_author_nonmembers(out_dir: Path, data_dir: Path, cfg: dict) -> dict[str, int]:
    """Non-member authors: `n_author_nonmembers` fictional authors drawn
    like the forget set (the same name, city, genre and canary pools) that no
    adapter trains on and the pre-training corpus does not hold: no name of
    a forget author, no canary title pair of a forget author or distractor.
    Membership inference's negatives for the author canaries.  Under coin
    inclusion they are the candidates the coins left out (data/inclusion.py)
    instead, so that they are exchangeable with the members."""
    if cfg.get("inclusion", FIXED) != FIXED:
        _, rest = candidates(cfg)
        write_parquet_atomic(syn.authors_frame(rest), out_dir / f"{AUTHOR_NONMEMBERS}.parquet")
        return {AUTHOR_NONMEMBERS: len(rest)}
    authors = pl.read_parquet(data_dir / "authors.parquet")
    distractors = pl.read_parquet(data_dir / "distractors.parquet")
    nonmembers = syn.make_authors(
        cfg["n_author_nonmembers"], cfg["seed"], prefix="n", last_names=FICTIONAL_LAST_NAMES,
        exclude_titles={syn.title_pair(c) for c in (*authors["canary"], *distractors["canary"])},
        exclude_names=set(authors["name"]),
    )
    write_parquet_atomic(syn.authors_frame(nonmembers), out_dir / f"{AUTHOR_NONMEMBERS}.parquet")
    return {AUTHOR_NONMEMBERS: len(nonmembers)}


# What a training seed's data folder holds (rule seed_data): every table a
# job of that seed may read, the authors' own split by its coins.
SEED_TABLES = (*DATA_TABLES, *POPULATION_TABLES, AUTHOR_NONMEMBERS)


def seed_data_settings(data: dict, train_seed: int) -> dict:
    """What a training seed's data folder depends on: the synthetic data's
    settings, the populations' counts and the seed its coins are drawn for."""
    return {**synthetic_settings(data), **population_settings(data), "train_seed": train_seed}


def write_seed_data(out_dir: Path, data_dir: Path, cfg: dict) -> dict[str, int]:
    """Training seed `cfg["train_seed"]`'s data folder under coin inclusion:
    its forget set (authors, their QA) and non-members drawn by its own
    coins from the same candidates, and a copy of every other table, so
    that each job of the seed reads one folder (`--data`).  The copies are
    the data folder's bytes, never regenerated: one draw of the rest."""
    if not per_seed(cfg):
        raise ValueError("a training seed's own data folder is written under `data.inclusion: coin` only "
                         f"(here `{cfg.get('inclusion', FIXED)}`: every seed reads the data folder)")
    authors, rest = candidates(cfg, cfg["train_seed"])
    tables = {"authors": syn.authors_frame(authors), "qa": syn.qa_frame(authors),
              AUTHOR_NONMEMBERS: syn.authors_frame(rest)}
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in SEED_TABLES:
        frame = tables[name] if name in tables else pl.read_parquet(data_dir / f"{name}.parquet")
        write_parquet_atomic(frame, out_dir / f"{name}.parquet")
    return {name: pl.scan_parquet(out_dir / f"{name}.parquet").select(pl.len()).collect().item()
            for name in SEED_TABLES}


def load_authors(path: Path) -> list[syn.Author]:
    frame = pl.read_parquet(path)
    fields = [f for f in syn.Author.__dataclass_fields__]
    return [syn.Author(**row) for row in frame.select(fields).iter_rows(named=True)]
