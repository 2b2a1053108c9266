"""Which draft family a folder holds, from its tensor names and config, and which runtime method fits.

A checkpoint of another family should get one clear "this is not a k3_dspark draft, it
is X" finding instead of a wall of missing-tensor findings. The name sets are the
public layouts:

- ``k3_dspark`` (MLA): ``layers.N.self_attn.q_a_proj``/``kv_a_proj_with_mqa`` +
  ``markov_head.*`` (Inferact/Kimi-K3-DSpark; vLLM ``dspark_mla.py``). Trainer names
  (``fc``/``hidden_norm``/``norm``) around an MLA body are still this family.
- ``speculators_dspark``: ``speculators_model_type: "dspark"`` in the config
  (vllm-project/speculators ``src/speculators/models/dspark``), GQA body with
  ``fc``/``hidden_norm``/``norm`` and the same heads.
- ``gqa_dspark``: a GQA DSpark layout (``q_proj``/``k_proj``/``v_proj`` + ``markov_head``)
  without the speculators config (DeepSpec ``dspark_qwen3_*``, SGLang ``Qwen3DSparkModel``).
- ``dflash``: the GQA block drafter without a Markov head (z-lab DFlash: ``fc``,
  ``hidden_norm``, ``layers.N.self_attn.q_proj``; config ``DFlashDraftModel``/``dflash_config``).
- ``eagle3``: ``midlayer.*`` or ``d2t``/``t2d`` with one decoder layer (EAGLE-3 exports,
  vLLM ``llama_eagle3.py``; speculators ``eagle3``).
- ``mtp``: ``mtp.*`` or ``eh_proj``/``enorm``/``hnorm``/``shared_head`` (DeepSeek MTP layers;
  config ``num_nextn_predict_layers``).

`sections["family"]` (JSON): ``{"family", "title", "confidence", "evidence": [str],
"methods": {runtime: method|null}, "config_model_type"}``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dspark_hub.format import contract

K3_DSPARK = "k3_dspark"


@dataclass(frozen=True)
class FamilySpec:
    """One draft family: its name, a human title and the runtime method that serves it."""

    name: str
    title: str
    methods: Mapping[str, str | None]     # runtime -> method flag value (None: not served)


FAMILIES: dict[str, FamilySpec] = {f.name: f for f in (
    FamilySpec(K3_DSPARK, "an MLA k3_dspark draft",
               {"vllm": "dspark", "tokenspeed": "DSPARK", "sglang": "DSPARK", "atom": "dspark"}),
    FamilySpec("speculators_dspark", "a speculators-format DSpark checkpoint",
               # sglang dspark.py refuses the speculators convention (slot j predicts anchor+j)
               {"vllm": "dspark", "tokenspeed": None, "sglang": None, "atom": None}),
    FamilySpec("gqa_dspark", "a GQA DSpark draft (Qwen3-style attention, not MLA)",
               {"vllm": "dspark", "tokenspeed": "DSPARK", "sglang": "DSPARK", "atom": "dspark"}),
    FamilySpec("dflash", "a DFlash block drafter (no Markov head)",
               {"vllm": "dflash", "tokenspeed": "DFLASH", "sglang": "DFLASH", "atom": None}),
    FamilySpec("eagle3", "an EAGLE-3 draft",
               {"vllm": "eagle3", "tokenspeed": "EAGLE3", "sglang": "EAGLE3", "atom": "eagle3"}),
    FamilySpec("mtp", "an MTP (multi-token prediction) layer set",
               {"vllm": "mtp", "tokenspeed": "MTP", "sglang": "NEXTN", "atom": "mtp"}),
    FamilySpec("unknown", "not a recognised draft family", {}),
)}

_LAYER = re.compile(r"^(?:model\.|module\.|_orig_mod\.)?layers\.\d+\.")


@dataclass
class Fingerprint:
    """The family a checkpoint belongs to and why."""

    family: str
    confidence: str                       # "config" | "names" | "config+names" | "none"
    evidence: list[str] = field(default_factory=list)
    config_model_type: Any = None

    @property
    def spec(self) -> FamilySpec:
        return FAMILIES[self.family]

    @property
    def is_k3_dspark(self) -> bool:
        return self.family == K3_DSPARK

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "title": self.spec.title, "confidence": self.confidence,
                "evidence": self.evidence, "methods": dict(self.spec.methods),
                "config_model_type": self.config_model_type}


def _has(names: set[str], *fragments: str) -> list[str]:
    return sorted(n for n in names if any(f in n for f in fragments))


def family_from_names(names: Iterable[str]) -> tuple[str | None, list[str]]:
    """Guess the family from tensor names alone (None when the names say nothing)."""
    names = set(names)
    if not names:
        return None, []
    mla = _has(names, ".self_attn.q_a_proj.", ".self_attn.kv_a_proj_with_mqa.")
    gqa = [n for n in _has(names, ".self_attn.q_proj.", ".self_attn.k_proj.") if _LAYER.match(n)]
    markov = _has(names, "markov_head.")
    mtp = _has(names, ".eh_proj.", ".enorm.", ".hnorm.", ".shared_head.") + sorted(n for n in names
                                                                                   if n.startswith("mtp."))
    eagle = _has(names, "midlayer.") + sorted(n for n in names if n in ("d2t", "t2d"))
    if mla and markov:
        return K3_DSPARK, [f"MLA attention ({mla[0]})", f"Markov head ({markov[0]})"]
    if mtp:
        return "mtp", [f"MTP tensors ({mtp[0]})"]
    if eagle:
        return "eagle3", [f"EAGLE-3 tensors ({eagle[0]})"]
    if gqa and markov:
        return "gqa_dspark", [f"GQA attention ({gqa[0]})", f"Markov head ({markov[0]})"]
    if gqa and _has(names, "fc.weight", "hidden_norm."):
        return "dflash", [f"GQA attention ({gqa[0]})", "fc/hidden_norm context path", "no Markov head"]
    if mla:
        return K3_DSPARK, [f"MLA attention ({mla[0]}) without a Markov head"]
    return None, []


def family_from_config(config: Mapping[str, Any] | None) -> tuple[str | None, list[str]]:
    """Guess the family from config keys alone (None when the config says nothing)."""
    if not config:
        return None, []
    if config.get("speculators_model_type") == "dspark":
        return "speculators_dspark", ["config.json speculators_model_type 'dspark'"]
    if config.get("model_type") == contract.MODEL_TYPE:
        return K3_DSPARK, ["config.json model_type 'k3_dspark'"]
    arch = " ".join(str(a) for a in config.get("architectures") or [])
    if config.get("speculators_model_type") == "eagle3" or "Eagle3" in arch:
        return "eagle3", [f"config.json architectures {arch or config.get('speculators_model_type')}"]
    if "DFlash" in arch or "dflash_config" in config:
        return "dflash", [f"config.json {'architectures ' + arch if 'DFlash' in arch else 'dflash_config'}"]
    if "DSpark" in arch:
        return "gqa_dspark", [f"config.json architectures {arch}"]
    if config.get("num_nextn_predict_layers"):
        return "mtp", [f"config.json num_nextn_predict_layers {config['num_nextn_predict_layers']}"]
    return None, []


def fingerprint(config: Mapping[str, Any] | None, names: Iterable[str] = ()) -> Fingerprint:
    """Name the draft family from config and tensor names.

    The tensor names win over a config that claims `k3_dspark` (a GQA body under a
    k3_dspark config is not a k3_dspark draft); a config that names another family wins
    over ambiguous names.
    """
    by_config, config_evidence = family_from_config(config)
    by_names, name_evidence = family_from_names(names)
    model_type = (config or {}).get("model_type")
    if by_config and by_names and by_config != by_names:
        family = by_names if by_config == K3_DSPARK else by_config
        return Fingerprint(family, "config+names", config_evidence + name_evidence, model_type)
    if by_config or by_names:
        family = by_config or by_names
        source = "config+names" if by_config and by_names else ("config" if by_config else "names")
        return Fingerprint(family, source, config_evidence + name_evidence, model_type)
    return Fingerprint("unknown", "none", [], model_type)
