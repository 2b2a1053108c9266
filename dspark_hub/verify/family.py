"""Which draft family a folder holds, from its config and tensor names, and which runtime method fits.

A checkpoint of another family should get one clear "this is not a k3_dspark draft, it
is X" finding instead of a wall of missing-tensor findings. The config is read first: a
declared `speculators_model_type` names the family whatever the tensor names look like (a
speculators `dflash` and a `dspark` with the Markov head off save byte-identical bodies, so
only the config tells them apart). The names decide when the config says nothing, and over a
config that claims `k3_dspark` (a GQA body under a hand-written k3_dspark config is not one).

Families and the layouts that identify them:

- ``k3_dspark`` (MLA): ``layers.N.self_attn.q_a_proj``/``kv_a_proj_with_mqa`` + ``markov_head.*``
  (Inferact/Kimi-K3-DSpark; vLLM ``dspark_mla.py``). Trainer names (``fc``/``hidden_norm``/``norm``)
  around an MLA body are still this family.
- ``speculators_<type>`` for every type speculators 0.9.0 registers (``dspark``, ``dflash``,
  ``dflash2``, ``xpress``, ``eagle3``, ``peagle``, ``mtp``): config ``speculators_model_type``;
  names second: ``refiner_head.*`` (xpress), ``candidate_selector.*``/``attention_conv`` (dflash2),
  ``mask_hidden`` (peagle), ``layers.0.hidden_norm`` (the speculators EAGLE-3 layout),
  ``mtp_layers.*`` (the speculators MTP layout).
- ``gqa_dspark``: a GQA body with ``markov_head.*`` and no speculators config (DeepSpec
  ``dspark_qwen3_*``, SGLang ``Qwen3DSparkModel``). A pruned vocabulary (``d2t``/``t2d``) does not
  make it EAGLE-3.
- ``dflash``: the GQA block drafter without a Markov head (``fc``, top-level ``hidden_norm``,
  ``layers.N.self_attn.q_proj``; config ``DFlashDraftModel``/``dflash_config``).
- ``eagle3``: ``midlayer.*``, or ``d2t``/``t2d`` otherwise unexplained (EAGLE-3 exports, vLLM
  ``llama_eagle3.py``).
- ``mtp``: ``mtp.*`` or ``eh_proj``/``enorm``/``hnorm``/``shared_head`` (DeepSeek MTP layers;
  config ``num_nextn_predict_layers``).

The vLLM methods of the speculators families are what vLLM 0.32.0 translates each
``speculators_model_type`` to (``vllm/transformers_utils/configs/speculators/algos.py``, executed);
``None`` where it rejects the type (``mtp``, ``xpress``: ``SpeculatorsConfig``, base.py:51-56).
No other runtime was found to load the speculators format.

`sections["family"]` (JSON): ``{"family", "title", "confidence", "evidence": [str],
"methods": {runtime: method|null}, "config_model_type", "format", "speculators_type"}``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dspark_hub.documents import Document
from dspark_hub.format import contract, speculators
from dspark_hub.format.registry import FORMATS, K3, K3_DSPARK, SPECULATORS, DraftFormat
from dspark_hub.vllm.pin import PINNED_VERSION

_NOT_SERVED = {"tokenspeed": None, "sglang": None, "atom": None}


@dataclass(frozen=True)
class FamilySpec:
    """One draft family: its name, a human title and the runtime method that serves it."""

    name: str
    title: str
    methods: Mapping[str, str | None]     # runtime -> method flag value (None: no method serves it)
    speculators_type: str | None = None   # the declared speculators_model_type, for speculators families
    serving_note: str | None = None
    format: str = "native"                # `k3_dspark`, `speculators` (the library's own format) or `native`
    claim_yields_to_names: bool = False   # a config that only claims it loses to tensor names of another family


def _speculators(kind: str, title: str, vllm: str | None, note: str | None = None) -> FamilySpec:
    return FamilySpec(f"speculators_{kind}", f"a speculators-format {title} checkpoint",
                      {"vllm": vllm, **_NOT_SERVED}, speculators_type=kind, serving_note=note,
                      format=SPECULATORS.cli_name)


FAMILIES: dict[str, FamilySpec] = {f.name: f for f in (
    FamilySpec(K3_DSPARK, "an MLA k3_dspark draft",
               {"vllm": "dspark", "tokenspeed": "DSPARK", "sglang": "DSPARK", "atom": "dspark"},
               format=K3.cli_name, claim_yields_to_names=True),     # a GQA body under a k3_dspark config is not one
    # sglang dspark.py refuses the speculators convention (slot j predicts anchor+j)
    _speculators("dspark", "DSpark", "dspark"),
    _speculators("dflash", "DFlash", "dflash"),
    _speculators("dflash2", "DFlash2", "dflash", f"vLLM {PINNED_VERSION} serves dflash2 through the dflash method "
                 "(update_dflash2, algos.py:129-149)"),
    _speculators("xpress", "XPress", None, f"vLLM {PINNED_VERSION} rejects speculators_model_type 'xpress' "
                 "(SpeculatorsConfig, base.py:51-56)"),
    _speculators("eagle3", "EAGLE-3", "eagle3"),
    _speculators("peagle", "P-EAGLE", "eagle3", f"vLLM {PINNED_VERSION} serves peagle as eagle3 with parallel_drafting "
                 "(update_peagle, algos.py:53-87)"),
    _speculators("mtp", "MTP", None, f"vLLM {PINNED_VERSION} rejects speculators_model_type 'mtp' "
                 "(SpeculatorsConfig, base.py:51-56)"),
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
class Fingerprint(Document):
    """The family a checkpoint belongs to and why."""

    KEYS = ("family", "title", "confidence", "evidence", "methods", "config_model_type", "format", "speculators_type")

    family: str
    confidence: str                       # "config" | "names" | "config+names" | "none"
    evidence: list[str] = field(default_factory=list)
    config_model_type: object = None

    @property
    def spec(self) -> FamilySpec:
        return FAMILIES[self.family]

    @property
    def title(self) -> str:
        return self.spec.title

    @property
    def methods(self) -> dict[str, str | None]:
        """Each runtime's method name for the family (None: the runtime does not serve it)."""
        return dict(self.spec.methods)

    @property
    def format(self) -> str:
        return self.spec.format

    @property
    def speculators_type(self) -> str | None:
        return self.spec.speculators_type


def methods_text(spec: FamilySpec) -> str:
    """`vllm dspark, tokenspeed DSPARK` (or `no runtime method known`), plus the family's serving note."""
    text = ", ".join(f"{rt} {m}" for rt, m in spec.methods.items() if m) or "no runtime method known"
    return text + (f"; {spec.serving_note}" if spec.serving_note else "")


def _has(names: set[str], *fragments: str) -> list[str]:
    return sorted(n for n in names if any(f in n for f in fragments))


def _starting(names: set[str], *prefixes: str) -> list[str]:
    return sorted(n for n in names if n.startswith(prefixes))


def family_from_names(names: Iterable[str]) -> tuple[str | None, list[str]]:
    """Guess the family from tensor names alone (None when the names say nothing)."""
    names = set(names)
    if not names:
        return None, []
    mla = _has(names, ".self_attn.q_a_proj.", ".self_attn.kv_a_proj_with_mqa.")
    gqa = [n for n in _has(names, ".self_attn.q_proj.", ".self_attn.k_proj.") if _LAYER.match(n)]
    markov = _has(names, "markov_head.")
    if mla and markov:
        return K3_DSPARK, [f"MLA attention ({mla[0]})", f"Markov head ({markov[0]})"]
    rules: list[tuple[str, list[str], str]] = [
        ("speculators_mtp", _starting(names, "mtp_layers."), "the speculators MTP layout"),
        ("mtp", _has(names, ".eh_proj.", ".enorm.", ".hnorm.", ".shared_head.") + _starting(names, "mtp."),
         "MTP tensors"),
        ("speculators_xpress", _starting(names, "refiner_head."), "the XPress refiner head"),
        ("speculators_dflash2", _starting(names, "candidate_selector.") + _has(names, ".attention_conv.",
                                                                                 ".mlp_conv."),
         "DFlash2 convolutions / candidate selector"),
    ]
    for family, found, what in rules:
        if found:
            return family, [f"{what} ({found[0]})"]
    if gqa and markov:
        return "gqa_dspark", [f"GQA attention ({gqa[0]})", f"Markov head ({markov[0]})"]
    if "mask_hidden" in names:
        return "speculators_peagle", ["P-EAGLE mask_hidden beside an EAGLE-3 layer"]
    eagle = _starting(names, "midlayer.") + sorted(n for n in names if re.fullmatch(r"layers\.0\.hidden_norm\.\w+", n))
    if eagle:
        family = "eagle3" if eagle[0].startswith("midlayer.") else "speculators_eagle3"
        return family, [f"EAGLE-3 layer ({eagle[0]})"]
    context = sorted(names & {"fc.weight", "hidden_norm.weight", "context_proj.weight", "context_norm.weight"})
    if gqa and not mla and context:     # the block drafter's body, whatever its context path is called
        return "dflash", [f"GQA attention ({gqa[0]})", f"context path ({', '.join(context)})", "no Markov head"]
    if names & {"d2t", "t2d"}:
        return "eagle3", ["EAGLE-3 vocabulary maps (d2t/t2d)"]
    if mla:
        return K3_DSPARK, [f"MLA attention ({mla[0]}) without a Markov head"]
    return None, []


def family_from_config(config: Mapping[str, Any] | None) -> tuple[str | None, list[str]]:
    """Guess the family from config keys alone (None when the config says nothing)."""
    if not config:
        return None, []
    declared = config.get(speculators.TYPE_KEY)
    if declared in speculators.REGISTERED_TYPES:
        return f"speculators_{declared}", [f"config.json {speculators.TYPE_KEY} {declared!r}"]
    if config.get("model_type") == contract.MODEL_TYPE:
        return K3_DSPARK, ["config.json model_type 'k3_dspark'"]
    archs = config.get("architectures")
    if not isinstance(archs, list):
        archs = []
    if contract.ARCHITECTURE in archs:
        return K3_DSPARK, [f"config.json architectures {contract.ARCHITECTURE}"]
    arch = " ".join(str(a) for a in archs)
    if "Eagle3" in arch:
        return "eagle3", [f"config.json architectures {arch}"]
    if "DFlash" in arch or "dflash_config" in config:
        return "dflash", [f"config.json {'architectures ' + arch if 'DFlash' in arch else 'dflash_config'}"]
    if "DSpark" in arch:
        return "gqa_dspark", [f"config.json architectures {arch}"]
    if config.get("num_nextn_predict_layers"):
        return "mtp", [f"config.json num_nextn_predict_layers {config['num_nextn_predict_layers']}"]
    return None, []


def fingerprint(config: Mapping[str, Any] | None, names: Iterable[str] = ()) -> Fingerprint:
    """Name the draft family: a declared type first, tensor names second.

    A config that names a family wins over the names (a speculators `dflash` and a `dspark`
    with the Markov head off have identical bodies); tensor names win over a config that only
    claims `k3_dspark` (a GQA body under a k3_dspark config is not a k3_dspark draft).
    """
    by_config, config_evidence = family_from_config(config)
    by_names, name_evidence = family_from_names(names)
    model_type = (config or {}).get("model_type")
    if by_config and by_names and by_config != by_names:
        declared = (config or {}).get(speculators.TYPE_KEY) in speculators.REGISTERED_TYPES
        # names beat a claimed k3_dspark, and beat an architecture guess when they name a speculators
        # layout (`DFlash2...` reads as DFlash; its candidate_selector says DFlash2)
        names_win = FAMILIES[by_config].claim_yields_to_names or (not declared and by_names.startswith("speculators_"))
        winner = by_names if names_win else by_config
        return Fingerprint(winner, "config+names", config_evidence + name_evidence, model_type)
    family = by_config or by_names
    if family:
        source = "config+names" if by_config and by_names else ("config" if by_config else "names")
        return Fingerprint(family, source, config_evidence + name_evidence, model_type)
    return Fingerprint("unknown", "none", [], model_type)


def detect(config: Mapping[str, Any] | None, names: Iterable[str] = ()) -> tuple[DraftFormat | None, Fingerprint]:
    """The registered format a checkpoint is in (None for another family), and the fingerprint that decided it."""
    found = fingerprint(config, names)
    return FORMATS.get(found.family), found
