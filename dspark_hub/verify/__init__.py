"""`verify`: every check dspark-hub makes of a draft, returning a `Report` of findings.

- `checks`: the entry point `verify()`, each format's config rules, roster, drop-in identity.
- `family`: which draft family a folder is (k3_dspark, every speculators type, DFlash, EAGLE-3, MTP), and
  `detect`, its registered draft format (`format.registry`).
- `speculators`: the config rules of a speculators DSpark (speculators 0.9.0, vLLM 0.32.0; sourced).
- `runtimes`: what each serving runtime's loader does with every tensor (tokenspeed, SGLang, ATOM: read).
- `runtimes_vllm`: vLLM's loader for a k3_dspark draft, as rules executed against vLLM 0.32.0, and the
  module-tree lookup both vLLM loaders share.
- `runtimes_speculators`: vLLM's loader for a speculators DSpark, as sourced rules, and its serving command.
- `verdicts`: the verdict vocabulary every loader spec shares, and the row-by-row comparison.
- `execute_vllm`: the engine that runs vLLM's own draft loader on CPU (`verify --execute`, the harness).
- `pairing`: a draft against its target model.
- `deep`: every byte streamed once (digests, NaN/inf, all-zero matrices).
- `against_hub`: local files against a Hub revision.
- `golden`: golden vectors of the reference forward (needs torch).
- `codes`: every finding code the checks emit, with its meaning (docs/codes.md's table).

Imports the format core (and `modeling` for golden vectors), never `train`, `cards`, `hub` or `cli`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_hub._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {"verify": "checks", "verify_view": "checks"})
__all__ = ["verify", "verify_view"]

if TYPE_CHECKING:
    from dspark_hub.verify.checks import verify, verify_view
