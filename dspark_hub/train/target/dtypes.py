"""The one spelling of a dtype: torch's names (`float32`, `bfloat16`, `float16`).

The short spellings (`fp32`, `bf16`, `fp16`) are accepted wherever a dtype is given and mean the
same (`canonical_dtype`): the target's engines, `eval --dtype` and `finetune --dtype` all read them here.
"""

from __future__ import annotations

from collections.abc import Iterable

from dspark_hub.errors import UsageError

#: Short dtype spellings -> the torch name each stands for.
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def canonical_dtype(name: str, allowed: Iterable[str], *, param: str = "dtype") -> str:
    """`name` as its torch name (`bf16` -> `bfloat16`), if it is one of `allowed` (torch names).

    Raises:
        UsageError: a dtype outside `allowed`, in either spelling.
    """
    choices = tuple(allowed)
    canonical = DTYPE_ALIASES.get(name, name)
    if canonical not in choices:
        raise UsageError(f"{name!r}; use one of {', '.join(dtype_spellings(choices))}", param=param)
    return canonical


def dtype_spellings(allowed: Iterable[str]) -> list[str]:
    """Every spelling of the `allowed` torch names: each name, then its short form."""
    choices = tuple(allowed)
    return [*choices, *(short for short, name in DTYPE_ALIASES.items() if name in choices)]
