"""No token in any output: every token huggingface_hub would send is replaced by `<token>` (`redact_tokens`).

An output concern with no dependency of ours: the CLI runs every line it prints through it (`cli/_output.py`),
the Hub client its error messages (`format/remote.py`). huggingface_hub is never imported here: before it is
imported, nothing could have sent a token.
"""

from __future__ import annotations

import contextlib
import sys

#: What a redacted token reads as.
REDACTED = "<token>"
#: Shorter strings are not treated as tokens (replacing them would garble ordinary text).
_MIN_TOKEN = 4


def hub_tokens(*given: object) -> list[str]:
    """Every token huggingface_hub would send from this process, by its own resolution, plus the `given` ones.

    `huggingface_hub.get_token()` (HF_TOKEN, the token file at HF_TOKEN_PATH or $HF_HOME/token, OIDC,
    Colab) and `get_stored_tokens()` (every token `hf auth login` saved). Before huggingface_hub is
    imported nothing could have sent a token, so it is not imported here (header-level commands stay light).
    Longest first, so a token that contains another is replaced whole.
    """
    found = {t for t in given if isinstance(t, str)}
    if "huggingface_hub" in sys.modules:
        from huggingface_hub import get_token
        from huggingface_hub.utils import get_stored_tokens

        with contextlib.suppress(Exception):   # an OIDC exchange that fails has sent nothing to leak
            found.add(get_token() or "")
        with contextlib.suppress(Exception):   # an unreadable stored_tokens file holds nothing to print
            found.update(get_stored_tokens().values())
    return sorted((t for t in found if len(t.strip()) >= _MIN_TOKEN), key=len, reverse=True)


def redact_tokens(text: str, *given: object) -> str:
    """`text` with every token of `hub_tokens(*given)` replaced by `<token>`."""
    for secret in hub_tokens(*given):
        text = text.replace(secret, REDACTED)
    return text
