"""Model cards: facts computed from the weights, rendered from jinja2 templates, and linted.

- `render`: `render_card()` and `write_card()` (templates in the repository's `templates/`).
- `facts`: `card_facts()`, what a card states about the weights, computed from the checkpoint.
- `front_matter`: the front matter checked the way the Hub checks it, and written in its key order.
- `templating`: the jinja2 environment, the card-source sandbox, and what `{{ value }}` prints.
- `results`: evaluation and training-log files turned into card tables.
- `labels`: the label under an acceptance table (measured or simulated), written and read back.
- `lint`: `lint_card()`, every stated fact against the checkpoint.
- `source`: the card source (`card.yaml`), read and checked key by key.
- `hub_vocab`: the Hub's license ids, pipeline tags and front-matter order.

Imports `verify` and the format core; never `train`, `hub` or `cli`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_hub._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "card_facts": "facts", "render_card": "render", "write_card": "render", "lint_card": "lint",
    "CardLintReport": "lint",
})
__all__ = ["CardLintReport", "card_facts", "lint_card", "render_card", "write_card"]

if TYPE_CHECKING:
    from dspark_hub.cards.facts import card_facts
    from dspark_hub.cards.lint import CardLintReport, lint_card
    from dspark_hub.cards.render import render_card, write_card
