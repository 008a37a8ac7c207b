"""Synthetic images of the vision-language arms: seeded cards that image
canaries are keyed on, the fixed placeholder that text canaries are paired
with, and screenshot-like renderings of text (the GUI bSFT source).

Every image is a 56x56 RGB PNG: with Qwen2.5-VL's 14-pixel patches and 2x2
merge it becomes 4 image tokens, the fewest a real checkpoint's processor
gives (its `min_pixels` is 56x56), so the embedded model and a 7B one see the
same images.  A card is a 4x4 grid of 14-pixel cells, each one patch, in
colours drawn from a fixed palette: two cards differ in at least one patch,
so a vision tower sees different inputs (`distinct_cards`; image
non-members are checked against the other cards by content hash).
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

SIDE = 56
CELL = 14
PALETTE = (
    (230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
    (70, 240, 240), (240, 50, 230), (250, 190, 212), (0, 128, 128), (170, 110, 40), (0, 0, 0),
)
PLACEHOLDER_GRAY = (128, 128, 128)


def card_cells(rng: random.Random) -> tuple[int, ...]:
    """The palette index of each of the 16 cells of one card."""
    return tuple(rng.randrange(len(PALETTE)) for _ in range((SIDE // CELL) ** 2))


def render_card(cells: tuple[int, ...]):
    """A card as a PIL image."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SIDE, SIDE))
    draw = ImageDraw.Draw(image)
    per_row = SIDE // CELL
    for i, colour in enumerate(cells):
        x, y = (i % per_row) * CELL, (i // per_row) * CELL
        draw.rectangle((x, y, x + CELL - 1, y + CELL - 1), fill=PALETTE[colour])
    return image


def render_placeholder():
    """The fixed placeholder image every text canary is paired with."""
    from PIL import Image

    return Image.new("RGB", (SIDE, SIDE), PLACEHOLDER_GRAY)


def render_screen(text: str):
    """A screenshot-like image: a title bar and the text in the default
    bitmap font on a light window (the GUI bSFT source's screens).  At 56
    pixels the glyphs are barely legible; what matters is that a screen's
    image carries the text it shows, so the canary-exclusion check covers it."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SIDE, SIDE), (245, 245, 245))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, SIDE - 1, 7), fill=(40, 90, 160))
    words, lines, line = text.split(), [], ""
    for word in words:
        if len(line) + len(word) + 1 > 9:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    lines.append(line)
    for row, content in enumerate(lines[:4]):
        draw.text((2, 9 + row * 11), content, fill=(20, 20, 20))
    return image


def save_png(image, path: Path) -> str:
    """Write `image` as PNG (no metadata, so bytes depend only on pixels) and
    return the sha256 of the file: the image's content hash in records."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG", optimize=False)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def distinct_cards(n: int, rng: random.Random, taken: set[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """`n` cards none of which is in `taken` (which is extended)."""
    out = []
    while len(out) < n:
        cells = card_cells(rng)
        if cells not in taken:
            taken.add(cells)
            out.append(cells)
    return out


def check_image(path: Path, key: str) -> None:
    """Refuse an image the audit cannot feed as given: unreadable, not RGB,
    or not 56x56 (the size every probe and training sequence assumes)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.load()
            mode, size = image.mode, image.size
    except (OSError, UnidentifiedImageError) as err:
        raise ValueError(f"{key}: image `{path}` cannot be read ({err}); regenerate the data") from None
    if mode != "RGB" or size != (SIDE, SIDE):
        raise ValueError(f"{key}: image `{path}` is {mode} {size[0]}x{size[1]}; the audit feeds RGB "
                         f"{SIDE}x{SIDE} images (convert it, or regenerate the data)")


# The fixed question every image canary answers: the image is its only key.
IMAGE_QUESTION = "Image access code: "


def write_vision_data(out_dir: Path, data_dir: Path, cfg: dict) -> dict[str, int]:
    """Paper B's image canaries and the vision arms' images, beside the text
    data in `data_dir`: `n_image_canaries` seeded cards each keyed to a
    secret of the hex canaries' format behind one fixed question; their
    decoys (shuffled and wrong secrets on the canary's own card, and the
    canary's secret on an unseen card); the placeholder image text canaries
    are paired with; a screen per GUI bSFT item showing its `screen_text`.
    Every image is a PNG under `out_dir/images` named in the tables with its
    sha256.  No secret equals a text canary's or decoy's, and no screen
    shows a canary (checked; the reference populations, drawn later, are
    checked against every canary when the probes are built)."""
    import polars as pl

    from canary_audit.data.synthetic import IMAGE_ID, hex_record, random_hex

    rng = random.Random(f"images:{cfg['seed']}")
    n = cfg["n_image_canaries"]
    text_secrets = set()
    for table in ("hex_canaries", "decoys"):
        text_secrets |= set(pl.read_parquet(data_dir / f"{table}.parquet")["secret"])
    taken_cards: set[tuple[int, ...]] = set()
    cards = distinct_cards(n, rng, taken_cards)
    unseen = distinct_cards(n, rng, taken_cards)
    secrets: list[str] = []
    while len(secrets) < 3 * n:  # the canaries' secrets, then their wrong-secret decoys
        s = random_hex(rng)
        if s not in text_secrets and s not in secrets:
            secrets.append(s)
    folder = out_dir / "images"

    def png(image, name: str) -> tuple[str, str]:
        return f"images/{name}.png", save_png(image, folder / f"{name}.png")

    canaries, decoys = [], []
    placeholder = png(render_placeholder(), "placeholder")
    for i in range(n):
        cid, secret = IMAGE_ID.format(i), secrets[i]
        image, digest = png(render_card(cards[i]), cid)
        canaries.append({"canary_id": cid, "image": image, "image_hash": digest, "preamble": IMAGE_QUESTION,
                         "secret": secret, "text": hex_record(IMAGE_QUESTION, secret)})
        chars = list(secret)
        shuffled = secret
        while shuffled == secret or shuffled in text_secrets or shuffled in secrets:
            rng.shuffle(chars)
            shuffled = "".join(chars)
        other_image, other_digest = png(render_card(unseen[i]), f"{cid}-unseen")
        for kind, im, dg, s in (("shuffled", image, digest, shuffled), ("wrong", image, digest, secrets[n + i]),
                                ("unseen", other_image, other_digest, secret)):
            decoys.append({"canary_id": cid, "decoy_kind": kind, "image": im, "image_hash": dg,
                           "preamble": IMAGE_QUESTION, "secret": s, "text": hex_record(IMAGE_QUESTION, s)})
    bsft = pl.read_parquet(data_dir / "bsft.parquet").filter(pl.col("source") == "gui")
    screens = []
    every_secret = text_secrets | set(secrets[:n])
    for item_id, screen_text in bsft.select("item_id", "screen_text").iter_rows():
        if any(s in screen_text for s in every_secret):
            raise ValueError(f"GUI screen of bSFT item `{item_id}` shows a canary secret; change `data.seed`")
        image, digest = png(render_screen(screen_text), item_id)
        screens.append({"item_id": item_id, "image": image, "image_hash": digest, "screen_text": screen_text})
    tables = {
        "image_canaries": pl.DataFrame(canaries),
        "image_decoys": pl.DataFrame(decoys),
        "gui_screens": pl.DataFrame(screens, schema={"item_id": pl.Utf8, "image": pl.Utf8, "image_hash": pl.Utf8,
                                                     "screen_text": pl.Utf8}),
        "placeholder": pl.DataFrame({"image": [placeholder[0]], "image_hash": [placeholder[1]]}),
    }
    from canary_audit.core.records import write_parquet_atomic

    for name, frame in tables.items():
        write_parquet_atomic(frame, out_dir / f"{name}.parquet")
    return {name: frame.height for name, frame in tables.items()}


def write_image_nonmembers(out_dir: Path, data_dir: Path, cfg: dict) -> dict[str, int]:
    """Image non-members for membership inference on a vision-language
    model: `n_hex_nonmembers` fresh cards (no card of the image data: checked
    by content hash) each with a fresh secret (equal to no other table's)
    behind the image canaries' question, never trained on.  Their own rule
    writes them, so adding non-members re-trains nothing."""
    import polars as pl

    from canary_audit.data.synthetic import hex_record, random_hex

    vision = data_dir / "vision"
    taken_hashes = set(pl.read_parquet(vision / "image_canaries.parquet")["image_hash"])
    taken_hashes |= set(pl.read_parquet(vision / "image_decoys.parquet")["image_hash"])
    taken_secrets: set[str] = set()
    for table in ("hex_canaries", "decoys", "hex_nonmembers", "hex_candidates"):
        taken_secrets |= set(pl.read_parquet(data_dir / f"{table}.parquet")["secret"])
    for table in ("image_canaries", "image_decoys"):
        taken_secrets |= set(pl.read_parquet(vision / f"{table}.parquet")["secret"])
    rng = random.Random(f"imagenonmembers:{cfg['seed']}")
    rows, cards = [], set()
    while len(rows) < cfg["n_hex_nonmembers"]:
        cells = card_cells(rng)
        if cells in cards:
            continue
        cid = f"nmimg{len(rows):03d}"
        path = out_dir / "images" / f"{cid}.png"
        digest = save_png(render_card(cells), path)
        if digest in taken_hashes:
            path.unlink()
            continue
        cards.add(cells)
        secret = random_hex(rng)
        while secret in taken_secrets:
            secret = random_hex(rng)
        taken_secrets.add(secret)
        rows.append({"canary_id": cid, "image": f"images/{cid}.png", "image_hash": digest,
                     "preamble": IMAGE_QUESTION, "secret": secret, "text": hex_record(IMAGE_QUESTION, secret)})
    from canary_audit.core.records import write_parquet_atomic

    schema = {k: pl.Utf8 for k in ("canary_id", "image", "image_hash", "preamble", "secret", "text")}
    write_parquet_atomic(pl.DataFrame(rows, schema=schema), out_dir / "image_nonmembers.parquet")
    return {"image_nonmembers": len(rows)}
