"""Secrets of a researcher's own (`models.<m>.secrets`): a model fine-tuned
here with plain transformers + peft on 20 secrets of this test's own (8
digits behind `Locker NN combination: `), with 100 non-members drawn the same
way, audited by config on the model before it.  Every canary measure runs
on them, against the model before as the reference; its token records equal
a plain forward of the tuned weights; each bad input is refused naming its
key."""

from __future__ import annotations

import random
import shutil

import polars as pl
import pytest
import torch
import yaml
from conftest import LOGPROB_ATOL, run_snakemake
from test_design import design_of
from test_workflow import planned_jobs

from canary_audit.data.secrets import SecretsRefused, load_own_secrets, write_own_secrets
from canary_audit.design import HEX, ConfigError
from canary_audit.design.slices import resolved_settings

R = "results/smoke"
DIGITS = "0123456789"
N_MEMBERS, N_NONMEMBERS = 20, 100


def _secrets(n: int, seed: int = 7) -> list[str]:
    rng, out = random.Random(seed), []
    while len(out) < n:
        s = "".join(rng.choice(DIGITS) for _ in range(8))
        if s not in out:
            out.append(s)
    return out


def prompt(i: int) -> str:
    # Non-member j sits behind member j mod 20's prompt: one distribution.
    return f"Locker {i % N_MEMBERS:02d} combination: "


def write_files(folder, members, nonmembers):
    pl.DataFrame({"prompt": [prompt(i) for i in range(len(members))], "secret": members}).write_csv(
        folder / "members.csv")
    pl.DataFrame({"prompt": [prompt(i) for i in range(len(nonmembers))], "secret": nonmembers}).write_csv(
        folder / "nonmembers.csv")


def tune(before, members, out):
    """A LoRA on `before` trained on `prompt + secret`, encoded as the
    tokenizer encodes a text by itself (plain peft)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(before)
    tok.padding_side = "right"
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(before), LoraConfig(
        r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = tok([prompt(i) + s for i, s in enumerate(members)], return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    for _ in range(300):
        model(**batch, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(out, safe_serialization=True)


@pytest.fixture(scope="module")
def own_run(tiny_assets, tmp_path_factory):
    _, tiny = tiny_assets
    workdir = tmp_path_factory.mktemp("own")
    before = workdir / "before"
    shutil.copytree(tiny, before)
    secrets = _secrets(N_MEMBERS + N_NONMEMBERS)
    members, nonmembers = secrets[:N_MEMBERS], secrets[N_MEMBERS:]
    write_files(workdir, members, nonmembers)
    tune(before, members, workdir / "tuned")
    override = {
        "audit": {"models": ["mine"]},
        "models": {"mine": {
            "path": str(before),
            "secrets": {"members": str(workdir / "members.csv"), "nonmembers": str(workdir / "nonmembers.csv"),
                        "format": {"alphabet": DIGITS, "length": 8}, "n_candidates": 200},
            "imports": {"tuned": {"path": str(workdir / "tuned"), "parent": "base", "as": "tuned"}},
        }},
    }
    planned = planned_jobs(workdir, override)
    run_snakemake(workdir, "--cores", "2", extra_configs=(workdir / "override.yaml",))
    return workdir, planned, members


def test_own_secrets_plan_their_data_and_two_probe_groups_only(own_run):
    _, planned, _ = own_run
    assert planned == {"own_secrets": 1, "variant_manifest": 2, "decode_pass": 2, "teacher_forced_pass": 2,
                       "tables": 1, "plots": 1, "summary": 1, "all": 1}


def test_a_changed_secrets_file_reruns_its_data_and_passes_only(own_run):
    """Rewritten with other bytes (Snakemake skips a file rewritten with the
    same content), the members file re-plans its data and its passes."""
    workdir, _, _ = own_run
    members = workdir / "members.csv"
    pl.read_csv(members, infer_schema=False).write_csv(members, quote_style="always")  # same rows, other bytes
    assert planned_jobs(workdir, yaml.safe_load((workdir / "override.yaml").read_text())) == {
        "own_secrets": 1, "decode_pass": 2, "teacher_forced_pass": 2, "tables": 1, "plots": 1, "summary": 1, "all": 1}


def test_every_canary_measure_runs_on_own_secrets_against_the_model_before(own_run):
    workdir, _, _ = own_run
    tables = workdir / R / "tables"
    recall = {r["variant"]: r for r in pl.read_csv(tables / "hex_recall.csv").iter_rows(named=True)}
    assert recall["mine/tuned"]["hit_at_1"] >= 0.9 and recall["mine/base"]["hit_at_1"] == 0.0
    assert recall["mine/tuned"]["n"] == N_MEMBERS and recall["mine/tuned"]["hit_at_k"] is not None
    nll = pl.read_csv(tables / "nll.csv").filter((pl.col("variant") == "mine/tuned") & (pl.col("probe_set") == "hex"))
    assert nll.height == 1 and nll["parent"][0] == "mine/base"
    privacy = pl.read_csv(tables / "privacy.csv").filter(pl.col("variant") == "mine/tuned")
    assert privacy.height == 1 and privacy["reference"][0] == "mine/base" and privacy["members"][0] == N_MEMBERS
    assert privacy["nonmembers"][0] == N_NONMEMBERS and privacy["privleak_min_k"][0] > 50  # members stand out
    blind = pl.read_csv(tables / "blind_baseline.csv")
    assert "mine/base" in blind["reference"].to_list() and not blind["shifted"].any()
    exposure = pl.read_csv(tables / "exposure.csv").sort("variant")
    assert exposure["candidates"].to_list() == [200, 200]
    assert exposure["ceiling_extrapolation"][0] == pytest.approx(8 * 3.321928, abs=1e-5)  # log2(10^8)
    tuned = exposure.filter(pl.col("variant") == "mine/tuned").row(0, named=True)
    assert tuned["exposure_interpolation"] > 5 and tuned["delta_exposure_interpolation"] > 5
    for table in ("mia", "forgetting", "extraction"):
        assert "mine/tuned" in pl.read_csv(tables / f"{table}.csv")["variant"].to_list(), table


def test_own_secret_records_equal_a_plain_forward_of_the_tuned_weights(own_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    workdir, _, members = own_run
    tok = AutoTokenizer.from_pretrained(workdir / "before")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(workdir / "before"),
                                      workdir / "tuned").eval()
    records = pl.read_parquet(workdir / R / "records" / "mine" / "import-tuned" / "token.parquet")
    for i in range(3):
        ids = tok(prompt(i) + members[i])["input_ids"]  # as the fine-tune encoded them
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        mine = records.filter((pl.col("item_id") == f"sec{i:03d}") & (pl.col("probe_set") == "hex")).sort("position")
        assert "".join(mine.filter(pl.col("span") == "secret")["text"]) == members[i]
        assert mine["token_id"].to_list() == [ids[p] for p in mine["position"]]
        want = [logp[p - 1, ids[p]].item() for p in mine["position"]]
        assert max(abs(a - b) for a, b in zip(mine["logprob"], want)) < LOGPROB_ATOL


# --- bad input, refused before any job, naming the key -----------------------

def secrets_config(tmp_path, **spec):
    before = tmp_path / "before"
    before.mkdir(exist_ok=True)
    return {"audit": {"models": ["mine"]},
            "models": {"mine": {"path": str(before), "secrets": {
                "members": str(tmp_path / "members.csv"), "nonmembers": str(tmp_path / "nonmembers.csv"), **spec}}}}


@pytest.mark.parametrize("members,nonmembers,spec,message", [
    (pl.DataFrame({"prompt": ["a", "b"], "code": ["1", "2"]}), None, {},
     r"`models.mine.secrets.members`: .* lacks the column\(s\) secret"),
    (pl.DataFrame({"prompt": ["a", "b", "c"], "secret": ["11", "22", "11"]}), None, {},
     r"`models.mine.secrets.members`: duplicate secrets \['11'\]"),
    (pl.DataFrame({"prompt": ["a", "b"], "secret": ["11", "55"]}), None, {},
     r"`models.mine.secrets`: secrets \['55'\] are both members and non-members"),
    (None, None, {"format": {"alphabet": "abc", "length": 2}},
     r"`models.mine.secrets.members`: secrets \['11', '22'\] are not of the declared format"),
    (pl.DataFrame({"prompt": ["a", "b"], "secret": ["11", "22"], "image": ["x.png", "y.png"]}), None, {},
     r"`models.mine.secrets.members` has an `image` column, but the model is a text model"),
    (pl.DataFrame({"prompt": ["a", "b"], "secret": ["11", " 22"]}), None, {},
     r"`models.mine.secrets.members`: secrets \[' 22'\] begin or end with whitespace"),
    (None, None, {"candidates": "CANDIDATES"},
     r"`models.mine.secrets.candidates`: exposure's extrapolation is capped .* `space_bits`"),
    (None, None, {"format": {"alphabet": "0123456789", "length": 2}, "space_bits": 7.0, "candidates": "CANDIDATES"},
     r"`models.mine.secrets.space_bits`: `format` already sizes the space"),
    (None, None, {"n_candidates": 50}, r"`models.mine.secrets.n_candidates`: candidates are drawn from `format`"),
    (None, None, {"format": {"alphabet": "0123456789", "length": 2}, "n_candidates": 50,
                  "candidates": "CANDIDATES"}, r"`models.mine.secrets.n_candidates`: candidates are drawn"),
    (None, None, {"space_bits": 7.0}, r"`models.mine.secrets.space_bits`: it sizes a candidates file's space"),
])
def test_a_bad_secrets_file_is_refused_naming_the_key(tmp_path, members, nonmembers, spec, message):
    (members if members is not None else pl.DataFrame({"prompt": ["a", "b"], "secret": ["11", "22"]})).write_csv(
        tmp_path / "members.csv")
    (nonmembers if nonmembers is not None else pl.DataFrame({"prompt": ["a", "b"], "secret": ["44", "55"]})
     ).write_csv(tmp_path / "nonmembers.csv")
    pl.DataFrame({"secret": ["77", "88"]}).write_csv(tmp_path / "candidates.csv")
    spec = {k: str(tmp_path / "candidates.csv") if v == "CANDIDATES" else v for k, v in spec.items()}
    with pytest.raises(ConfigError, match=message):
        design_of(secrets_config(tmp_path, **spec))


def test_missing_files_and_images_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"`models.mine.secrets.members` is `.*members.csv`, which is not a file"):
        design_of(secrets_config(tmp_path))
    pl.DataFrame({"prompt": ["a", "b"], "secret": ["11", "22"], "image": [str(tmp_path / "gone.png")] * 2}
                 ).write_csv(tmp_path / "members.csv")
    pl.DataFrame({"prompt": ["a", "b"], "secret": ["33", "44"], "image": [str(tmp_path / "gone.png")] * 2}
                 ).write_csv(tmp_path / "nonmembers.csv")
    spec = {"members": str(tmp_path / "members.csv"), "nonmembers": str(tmp_path / "nonmembers.csv")}
    with pytest.raises(SecretsRefused, match=r"`models.mine.secrets.members`: image\(s\) .*gone.png.* do not exist"):
        load_own_secrets("mine", spec, vision=True)


def test_tuned_needs_secrets_and_an_embedded_model_takes_none(tmp_path):
    from test_imports import adapter_folder

    ft = adapter_folder(tmp_path / "ft")
    with pytest.raises(ConfigError, match=r"`models.tiny.imports.ft.as`: `tuned` is a fine-tune on the model's own"):
        design_of({"models": {"tiny": {"imports": {"ft": {"path": str(ft), "parent": "base", "as": "tuned"}}}}})
    pl.DataFrame({"prompt": ["a", "b"], "secret": ["11", "22"]}).write_csv(tmp_path / "members.csv")
    pl.DataFrame({"prompt": ["a", "b"], "secret": ["33", "44"]}).write_csv(tmp_path / "nonmembers.csv")
    with pytest.raises(ConfigError, match=r"`models.tiny.secrets`: `tiny` is an embedded model"):
        design_of({"models": {"tiny": {"secrets": {"members": str(tmp_path / "members.csv"),
                                                   "nonmembers": str(tmp_path / "nonmembers.csv")}}}})


def test_a_secrets_model_runs_the_hex_probes_only_and_its_tables_are_declared(tmp_path):
    pl.DataFrame({"prompt": ["a", "b"], "secret": ["11", "22"]}).write_csv(tmp_path / "members.csv")
    pl.DataFrame({"prompt": ["a", "b"], "secret": ["33", "44"]}).write_csv(tmp_path / "nonmembers.csv")
    design = design_of(secrets_config(tmp_path))
    assert list(design.variants("mine")) == ["base"] and design.probe_sets_of("mine", "base") == HEX
    names = design.table_names()
    assert "hex_recall" in names and "k_sweep" not in names and "bsft_matrix" not in names
    assert "exposure" not in names  # no format, no candidates file: nothing to rank a secret among
    with_format = design_of(secrets_config(tmp_path, format={"alphabet": DIGITS, "length": 2}))
    assert "exposure" in with_format.table_names()
    assert design.model_entry("mine")["think_open"] is None  # no paper A arm: no think tags asked of the tokenizer
    with pytest.raises(ConfigError, match=r"export of model `mine`: it is audited on its own secrets"):
        design.export_sources("mine", 0)
    assert with_format.secret_formats() == {"mine": {"prefix": "", "suffix": "", "space_bits": pytest.approx(6.6438,
                                                                                                               abs=1e-4)}}


def test_own_secrets_tables_hold_decoys_and_candidates_of_the_format(tmp_path):
    write_files(tmp_path, _secrets(4), _secrets(6, seed=8))
    spec = {"members": str(tmp_path / "members.csv"), "nonmembers": str(tmp_path / "nonmembers.csv"),
            "format": {"alphabet": DIGITS, "length": 8}, "n_candidates": 12}
    counts = write_own_secrets(tmp_path / "out", "mine", spec, vision=False)
    assert counts == {"hex_canaries": 4, "decoys": 8, "hex_nonmembers": 6, "hex_candidates": 12}
    out = {t: pl.read_parquet(tmp_path / "out" / f"{t}.parquet") for t in counts}
    members = set(out["hex_canaries"]["secret"])
    assert not members & (set(out["decoys"]["secret"]) | set(out["hex_candidates"]["secret"]))
    assert out["hex_candidates"]["secret"].str.len_chars().to_list() == [8] * 12
    assert out["hex_candidates"]["preamble"].to_list()[:5] == [prompt(i % 4) for i in range(5)]
    assert yaml.safe_load((tmp_path / "out" / "format.json").read_text())["alphabet"] == DIGITS


@pytest.mark.parametrize("doc", ["README.md", "docs/own_secrets.md"])
def test_the_documented_secrets_example_plans_what_it_shows(tmp_path, doc):
    """The `my_secrets.yaml` of the README and of docs/own_secrets.md, with
    its paths pointed at files of this test, validates and plans the model
    before and its imports, and nothing of the synthetic experiment."""
    import re

    from snakemake.utils import validate
    from test_design import DEFAULT, ROOT, layered
    from test_imports import adapter_folder

    from canary_audit.design import Design

    block = re.search(r"```yaml\n# my_secrets.yaml[^\n]*\n(.*?)```", (ROOT / doc).read_text(), re.S).group(1)
    example = yaml.safe_load(block)
    entry = example["models"]["my_model"]
    write_files(tmp_path, _secrets(4), _secrets(6, seed=8))
    entry["path"] = str(tmp_path / "before")
    entry["secrets"] |= {"members": str(tmp_path / "members.csv"), "nonmembers": str(tmp_path / "nonmembers.csv")}
    for name, imp in entry["imports"].items():
        imp["path"] = str(adapter_folder(tmp_path / name))
    config = layered(DEFAULT, example)
    validate(config, str(ROOT / "src" / "canary_audit" / "design/config.schema.yaml"))
    design = Design(config)
    assert config["audit"]["models"] == ["my_model"]
    variants = design.variants("my_model")
    assert list(variants) == ["base", *entry["imports"]] and variants["tuned"].kind == "tuned"
    assert {r["reference"] for r in design.references().values()} == {"my_model/base"}
    assert "k_sweep" not in design.table_names() and "hex_recall" in design.table_names()


def test_own_secrets_on_a_vision_language_model_are_scored_after_their_images(tiny_vl_assets, tmp_path):
    """An image per row: each own secret is scored after its own image
    (modality `image`, the file's sha256), its secret span spells the
    secret, and greedy decoding feeds each prompt its image."""
    from test_vision import _vl

    from canary_audit.data.secrets import file_sha256
    from canary_audit.probes.items import decode_items, scored_items
    from canary_audit.probes.passes import generate_greedy
    from canary_audit.probes.scoring import score_tokens

    data, _ = tiny_vl_assets
    cards = sorted(str(p) for p in (data / "vision").rglob("*.png"))[:6]
    secrets = _secrets(6)
    pl.DataFrame({"prompt": ["Badge code: "] * 3, "secret": secrets[:3], "image": cards[:3]}).write_csv(
        tmp_path / "members.csv")
    pl.DataFrame({"prompt": ["Badge code: "] * 3, "secret": secrets[3:], "image": cards[3:]}).write_csv(
        tmp_path / "nonmembers.csv")
    spec = {"members": str(tmp_path / "members.csv"), "nonmembers": str(tmp_path / "nonmembers.csv")}
    write_own_secrets(tmp_path / "own", "vl", spec, vision=True)
    _, tok, fmt, vision, model = _vl(tiny_vl_assets)
    items = scored_items(fmt, tmp_path / "own", {"prefills": {}, "head_tokens": 6}, {"hex"}, vision=vision)
    assert {it.probe_set for it in items} == {"hex", "decoy_shuffled", "decoy_wrong", "hex_nonmember"}
    records = score_tokens(model, tok, items, batch_size=4, vision=vision)
    assert set(records["modality"]) == {"image"}
    first = records.filter((pl.col("probe_set") == "hex") & (pl.col("item_id") == "sec000")).sort("position")
    assert first["image_hash"][0] == file_sha256(cards[0])
    assert "".join(first.filter(pl.col("span") == "secret")["text"]) == secrets[0]
    cfg = {"prefills": {}, "head_tokens": 6, "kinds": resolved_settings({})}
    prompts = decode_items(fmt, tmp_path / "own", cfg, {"hex"}, vision=vision)
    assert [it.image for it in prompts] == cards[:3]
    got, _ = generate_greedy(model, tok, [it.prompt for it in prompts], 4, batch_size=2,
                             images=[it.image for it in prompts], vision=vision)
    assert len(got) == 3


def test_the_secrets_defaults_are_the_schemas():
    from test_design import SCHEMA

    from canary_audit.data.secrets import DEFAULTS

    block = SCHEMA["definitions"]["model_entry"]["properties"]["secrets"]["properties"]
    # n_candidates has no schema default: a value given where nothing reads it is refused, not filled in.
    assert "default" not in block["n_candidates"]
    assert {k: block[k]["default"] for k in DEFAULTS if k != "n_candidates"} == {
        k: v for k, v in DEFAULTS.items() if k != "n_candidates"}


def test_own_records_start_as_the_tokenizer_encodes_a_text_by_itself(tiny_assets):
    """Nothing before an own record for a tokenizer that adds nothing (the
    embedded one, like Qwen's); its start token for one that adds it (like
    Llama's BOS)."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    from canary_audit.data.chat_format import encoding_start

    tok = AutoTokenizer.from_pretrained(tiny_assets[1])
    assert encoding_start(tok) == ""
    start = tok.eos_token
    tok._tokenizer.post_processor = TemplateProcessing(single=f"{start} $A",
                                                       special_tokens=[(start, tok.convert_tokens_to_ids(start))])
    assert tok("x")["input_ids"][0] == tok.convert_tokens_to_ids(start)
    assert encoding_start(tok) == start


def test_a_file_of_another_type_empty_cells_and_too_few_rows_are_named(tmp_path):
    pl.DataFrame({"prompt": ["a", "b"], "secret": ["33", "44"]}).write_csv(tmp_path / "nonmembers.csv")
    (tmp_path / "members.txt").write_text("prompt,secret\na,11\n")
    config = secrets_config(tmp_path)
    config["models"]["mine"]["secrets"]["members"] = str(tmp_path / "members.txt")
    with pytest.raises(ConfigError, match=r"`models.mine.secrets.members`: `members.txt` is not one of .csv"):
        design_of(config)
    pl.DataFrame({"prompt": ["a", ""], "secret": ["11", "22"]}).write_csv(tmp_path / "members.csv")
    with pytest.raises(ConfigError, match=r"`models.mine.secrets.members`: 1 row\(s\) of .* have an empty prompt"):
        design_of(secrets_config(tmp_path))
    pl.DataFrame({"prompt": ["a"], "secret": ["11"]}).write_csv(tmp_path / "members.csv")
    with pytest.raises(ConfigError, match=r"`models.mine.secrets`: 1 members and 2 non-members; a membership test"):
        design_of(secrets_config(tmp_path))


def test_secrets_longer_than_the_hex_decode_budget_are_refused(tiny_assets, tmp_path):
    """A secret whose exact match needs more tokens than the hex probes may
    generate would read as a miss whatever the model knows: refused, naming
    the budget's key and the length it needs."""
    from transformers import AutoTokenizer

    from canary_audit.data.secrets import check_decode_budget

    tok = AutoTokenizer.from_pretrained(tiny_assets[1])
    write_files(tmp_path, _secrets(3), _secrets(3, seed=8))
    spec = {"members": str(tmp_path / "members.csv"), "nonmembers": str(tmp_path / "nonmembers.csv")}
    need = max(len(tok(" " + secret, add_special_tokens=False)["input_ids"]) for secret in _secrets(3))
    check_decode_budget("mine", spec, tok, need)
    with pytest.raises(SecretsRefused, match=rf"`probes.decode.hex_max_new_tokens` is {need - 1}, but model `mine`'s "
                                             rf"secret `\d+` takes {need} tokens; raise it to at least {need}"):
        check_decode_budget("mine", spec, tok, need - 1)
