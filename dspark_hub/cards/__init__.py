"""Model cards: facts computed from the weights, rendered from jinja2 templates, and linted.

- `render`: `card_facts()`, `render_card()` and `write_card()` (templates in the repository's `templates/`).
- `results`: evaluation and training-log files turned into card tables.
- `lint`: `lint_card()`, every stated fact against the checkpoint.
- `hub_vocab`: the Hub's license ids, pipeline tags and front-matter order.

Imports `verify` and the format core; never `train`, `hub` or `cli`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_hub._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "card_facts": "render", "render_card": "render", "write_card": "render", "lint_card": "lint",
})
__all__ = ["card_facts", "lint_card", "render_card", "write_card"]

if TYPE_CHECKING:
    from dspark_hub.cards.lint import lint_card
    from dspark_hub.cards.render import card_facts, render_card, write_card
