"""Card test fixtures: a header-only reference-shaped checkpoint and the card sources in `cards/`.

`python -m tests.card_fixtures` regenerates both committed cards (after a template change).
"""

from __future__ import annotations

import struct
import sys
import tempfile
from pathlib import Path

import pytest

from dspark_hub.format import contract

ROOT = Path(__file__).resolve().parent.parent
SDDD = ROOT / "cards" / "kimi-k3-dspark-sddd"
SPECULATOR = ROOT / "cards" / "kimi-k3-speculator-dspark"
SEED_CARD = Path("/work/shared/seeds/kimi-k3-dspark-sddd-card.md")


def write_sparse_reference(folder: Path) -> Path:
    """A reference-shaped checkpoint whose tensor bytes are a hole: 7.12 GB long, a few KB on disk.

    The header is the real one (`contract.expected_header(REFERENCE_CONFIG)`); the data area is
    left to `truncate`, so the file reads as zeros without being written.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / contract.CONFIG_NAME).write_bytes(contract.reference_config_bytes())
    header = contract.expected_header(contract.REFERENCE_CONFIG)
    with open(folder / contract.WEIGHTS_NAME, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(contract.expected_file_size(contract.REFERENCE_CONFIG))
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny conforming checkpoint written by `init` (random weights, seed 1)."""
    from dspark_hub.ops.init import init_checkpoint

    return init_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", profile="tiny", seed=1).path


def render_sddd(ckpt: Path) -> str:
    from dspark_hub.cards.render import render_card

    return render_card(SDDD / "card.yaml", ckpt, checksums_from=SDDD / "checksums.json", hash_files=False)


def render_speculator() -> str:
    from dspark_hub.cards.render import render_card

    return render_card(SPECULATOR / "card.yaml")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (SDDD / "README.md").write_text(render_sddd(write_sparse_reference(Path(tmp) / "ref")), encoding="utf-8")
    (SPECULATOR / "README.md").write_text(render_speculator(), encoding="utf-8")
    print("regenerated", SDDD / "README.md", SPECULATOR / "README.md", file=sys.stderr)


if __name__ == "__main__":
    main()
