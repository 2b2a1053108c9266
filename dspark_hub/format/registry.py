"""The draft formats dspark-hub knows, as a registry: every entry answers the same questions.

- ``k3_dspark``: the MLA contract of `Inferact/Kimi-K3-DSpark` (`format.contract`).
- ``speculators_dspark``: a DSpark saved by the `speculators` library (`format.speculators`).

Each `DraftFormat` gives, for a config:

- `roster(config)`: the tensors (names, shapes, dtypes) the config implies;
- `counts(shapes)`: total / trained / frozen parameters (vocabulary maps apart);
- `pairing_keys(config)`: what the config says about its target (tap width, layer count,
  vocabulary, taps in OUR `target_layer_ids` convention via `format.taps`);
- `serving(config)`: the runtime method and the number of speculative tokens;

and, as plain fields, what the commands branch on (is it trainable here, does convert repair it,
does the exported modeling code load it, which vLLM class loads it, ...). Code outside `format/`
asks these fields; it never compares a format's name (`tests/test_format_dispatch.py`).

The layers above extend an entry where the format core cannot reach: verify's config rules
(`verify.checks.config_findings`) and runtime loader rules (`verify.runtimes.loaders.loaders_for`), each a
table keyed by `DraftFormat.name`. `verify.family.detect(config, names)` picks the entry from the
family fingerprint; a folder of any other family has no entry and gets one family finding. A later
format plugs in as one more `DraftFormat` here (plus a row in those two tables).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dspark_hub.documents import Document
from dspark_hub.errors import ContractError
from dspark_hub.format import contract, speculators, taps
from dspark_hub.format.contract import ParameterCounts, TensorSpec
from dspark_hub.report import Finding

#: The family names (`verify.family`) of the registered formats.
K3_DSPARK = "k3_dspark"
SPECULATORS_DSPARK = "speculators_dspark"


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class PairingKeys(Document):
    """What a draft config says about the target it pairs with, each with the key it came from."""

    KEYS = ("tap_width", "vocab_size", "draft_vocab_size", "target_layers", "target_layer_ids=taps",
            "native_layer_ids=native_taps", "native_layer_ids_key=taps_key", "verifier")

    tap_width: int | None              # hidden size of each tapped state = the target's hidden size
    tap_width_key: str
    vocab_size: int | None             # the target vocabulary the draft scores in
    vocab_key: str
    draft_vocab_size: int | None
    target_layers: int | None          # the target's layer count, when the config records it
    target_layers_key: str | None
    taps: list[int] | None             # OUR convention: target_layer_ids entry l = output of layer l
    native_taps: list[int] | None      # as the config writes them
    taps_key: str
    mask_token_id: int | None
    embedding: str | None              # the draft tensor that must equal the target's embedding, if any
    verifier: str | None = None        # the model the draft was trained against, when recorded
    verifier_architectures: list[str] | None = None


@dataclass(frozen=True)
class ServingFacts:
    """How the config says the draft is served: method, tokens per step and where that number came from."""

    method: str
    num_speculative_tokens: int | None
    source: str                        # where the number came from
    verifier: str | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RosterHints:
    """Format-specific words for the roster findings (the codes are shared)."""

    misnames: Mapping[str, str] = field(default_factory=dict)   # wrong name -> right name
    misname_why: str = ""
    skipped_extras: tuple[str, ...] = ()
    dtype_hint: str = "cast the tensors to the dtype the config declares"
    missing_hint: str = "export every roster tensor"


@dataclass(frozen=True)
class DraftFormat:
    """One checkpoint format dspark-hub verifies end to end."""

    name: str                          # the family name (`verify.family`)
    cli_name: str                      # the name commands accept (`--to`, `--from`)
    title: str
    roster: Callable[[Mapping[str, Any]], dict[str, TensorSpec]]
    counts: Callable[[Mapping[str, Any]], ParameterCounts]
    pairing_keys: Callable[[Mapping[str, Any]], PairingKeys]
    tap_findings: Callable[[Mapping[str, Any], int], list[Finding]]   # taps against a target's layer count
    serving: Callable[[Mapping[str, Any]], ServingFacts]
    hints: RosterHints
    frozen_tensors: tuple[str, ...]
    frozen_note: str                   # what the frozen tensors are, for cards
    tap_convention: str
    layer_order: Callable[[Mapping[str, Any]], list[str]]              # layer 0's tensor names, module order
    block_size: Callable[[Mapping[str, Any]], int | None]              # the trained block size, if a config key
    taps_key: str                      # the config key that lists the taps, in the format's own convention
    to_native_taps: Callable[[list[int]], list[int]]   # taps in OUR convention, as this format writes them
    attention_modules: tuple[str, ...]  # per-layer attention tensors (no counterpart in another format)
    counterpart: Callable[[str], str | None]   # this format's name for a tensor of the other format (crosswalk)
    sorted_data: bool = False          # the reference file stores tensor data in sorted-name order
    tap_note: str | None = None        # a short reading of the tap ids, where they are not layer outputs
    target_embedding: str | None = None  # the tensor that must equal the target's embedding (None: never saved)
    trainable: bool = False            # rollouts and finetune train it (its taps are `target_layer_ids`)
    repairable: bool = False           # convert repairs near-miss exports of it (renames, layout, dtype)
    remote_code: bool = False          # the exported transformers modeling code (export-code) loads it
    records_target_config: bool = False  # the config copies the target's keys, checked one by one on pairing
    markov_optional: bool = False      # it can draft with its Markov head switched off
    anchor_layout_key: str | None = None  # a config key eval needs written (its trainer and vLLM defaults differ)
    vllm_model_class: str | None = None   # the vLLM 0.32.0 class that loads it (None: vLLM has no loader)
    rope_pairing: str | None = None    # the RoPE channel pairing its contract fixes, which a port may get wrong
    #: Drafted tokens a step at the block the config says it trained with (None: not a config key)
    trained_k: Callable[[Mapping[str, Any]], int | None] = lambda config: None

    def try_roster(self, config: Mapping[str, Any]) -> dict[str, TensorSpec] | None:
        try:
            return self.roster(config)
        except ContractError:
            return None


# ---------------------------------------------------------------- k3_dspark

_K3_EMBEDDING = contract.FROZEN_TENSORS[0]

def _k3_pairing(config: Mapping[str, Any]) -> PairingKeys:
    ids = config.get("target_layer_ids")
    ids = list(ids) if isinstance(ids, list) else None
    return PairingKeys(
        tap_width=config.get("target_hidden_size"), tap_width_key="target_hidden_size",
        vocab_size=config.get("vocab_size"), vocab_key="vocab_size",
        draft_vocab_size=_int_or_none(config.get("draft_vocab_size")),
        target_layers=config.get("target_num_hidden_layers"), target_layers_key="target_num_hidden_layers",
        taps=ids, native_taps=ids, taps_key="target_layer_ids",
        mask_token_id=_int_or_none(config.get("mask_token_id")), embedding=_K3_EMBEDDING)


def _k3_serving(config: Mapping[str, Any]) -> ServingFacts:
    n = contract.REFERENCE_BLOCK_SIZE
    return ServingFacts(method="dspark", num_speculative_tokens=n,
                        source=f"default: the reference draft's {n} (block_size is not a config key)")


K3 = DraftFormat(
    name=K3_DSPARK, cli_name="k3_dspark", title="k3_dspark",
    roster=contract.roster, counts=contract.count_parameters,
    pairing_keys=_k3_pairing,
    tap_findings=lambda config, layers: taps.tap_layer_findings(config, target_layers=layers,
                                                                 code="PAIRING_LAYER_ID"),
    serving=_k3_serving,
    hints=RosterHints(misnames=contract.KNOWN_MISNAMES,
                      misname_why="a runtime that ignores unknown names drops the context path and serves at 0% "
                                  "acceptance",
                      skipped_extras=contract.SKIPPED_EXTRAS, dtype_hint="cast to bfloat16 ('dspark-hub convert')",
                      missing_hint="export every contract tensor; 'dspark-hub verify --json' lists the full roster "
                                   "(sections.roster)"),
    frozen_tensors=contract.FROZEN_TENSORS, frozen_note="`embed_tokens` is frozen and shared with the teacher",
    tap_convention=taps.TAP_CONVENTION,
    layer_order=lambda config: [s.name for s in contract.layer_roster(config, 0)],
    block_size=lambda config: None,    # not a config key: serving engines take it from the command line
    taps_key="target_layer_ids", to_native_taps=list,
    attention_modules=("self_attn.q_a_proj.weight", "self_attn.q_a_layernorm.weight", "self_attn.q_b_proj.weight",
                       "self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_layernorm.weight",
                       "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight"),
    counterpart=speculators.k3_counterpart,
    sorted_data=True, target_embedding=_K3_EMBEDDING, trainable=True, repairable=True, remote_code=True,
    records_target_config=True, vllm_model_class="K3DSparkForCausalLM", rope_pairing="interleaved",
)


# ---------------------------------------------------------------- speculators DSpark

def _speculators_pairing(config: Mapping[str, Any]) -> PairingKeys:
    tl = config.get(speculators.LAYER_CONFIG_KEY)
    tl = tl if isinstance(tl, Mapping) else {}
    declared = config.get("target_hidden_size")
    width, width_key = (declared, "target_hidden_size") if declared is not None else \
        (tl.get("hidden_size"), f"{speculators.LAYER_CONFIG_KEY}.hidden_size")
    ids = config.get(speculators.AUX_IDS_KEY)
    ids = list(ids) if isinstance(ids, list) and all(_int_or_none(i) is not None for i in ids) else None
    spec = config.get("speculators_config")
    verifier = spec.get("verifier") if isinstance(spec, Mapping) else None
    arch = verifier.get("architectures") if isinstance(verifier, Mapping) else None
    return PairingKeys(
        tap_width=width, tap_width_key=width_key,
        vocab_size=tl.get("vocab_size"), vocab_key=f"{speculators.LAYER_CONFIG_KEY}.vocab_size",
        draft_vocab_size=_int_or_none(config.get("draft_vocab_size")),
        target_layers=None, target_layers_key=None,     # speculators configs do not record the target's depth
        taps=taps.taps_from_aux_ids(ids) if ids is not None else None, native_taps=ids,
        taps_key=speculators.AUX_IDS_KEY, mask_token_id=_int_or_none(config.get("mask_token_id")),
        embedding=None,                                  # embed_tokens is never saved (the verifier's is used)
        verifier=speculators.verifier_name(config),
        verifier_architectures=list(arch) if isinstance(arch, list) else None)


def _speculators_taps(config: Mapping[str, Any], layers: int) -> list[Finding]:
    return taps.aux_id_findings(config.get(speculators.AUX_IDS_KEY), target_layers=layers, code="PAIRING_LAYER_ID")


def serving_facts(config: Mapping[str, Any]) -> ServingFacts:
    """Method, token count and verifier a speculators DSpark config implies for vLLM."""
    declared = speculators.speculative_tokens(config)
    written = speculators.written_speculative_tokens(config)
    notes = []
    if declared is not None and written is not None and declared != written:
        notes.append(f"speculative_tokens {declared} differs from what training writes for this block layout "
                     f"({written})")
    n: int | None
    if declared is not None:
        n, source = declared, "speculators_config.proposal_methods[0].speculative_tokens"
    else:
        n, source = written, "block_size (speculative_tokens is not recorded)"
    if not config.get("sample_from_anchor", speculators.DEFAULTS["sample_from_anchor"]):
        notes.append(f"bonus-anchor layout (sample_from_anchor false): {n} drafted tokens per step for block_size "
                     f"{config.get('block_size')}; give the count explicitly, as these commands do")
    return ServingFacts(method="dspark", num_speculative_tokens=n, source=source,
                        verifier=speculators.verifier_name(config), notes=tuple(notes))


SPECULATORS = DraftFormat(
    name=SPECULATORS_DSPARK, cli_name="speculators", title="speculators DSpark",
    roster=speculators.roster, counts=speculators.count_parameters,
    pairing_keys=_speculators_pairing, tap_findings=_speculators_taps, serving=serving_facts,
    hints=RosterHints(misnames={v: k for k, v in contract.KNOWN_MISNAMES.items()},
                      misname_why="it is the k3_dspark name; speculators and vLLM look up the speculators name and "
                                  "refuse (or drop) this one",
                      dtype_hint="save every float tensor in the dtype config.json declares (d2t int64, t2d bool)",
                      missing_hint="save the checkpoint with the speculators library (save_pretrained writes every "
                                   "roster tensor; 'dspark-hub verify --json' lists it in sections.roster)"),
    frozen_tensors=speculators.FROZEN_TENSORS,
    frozen_note="`lm_head` holds the verifier's rows for the pruned draft vocabulary and is frozen",
    tap_convention=taps.AUX_ID_CONVENTION,
    layer_order=lambda config: list(speculators.layer_shapes(speculators.geometry(config), 0)),
    block_size=lambda config: _int_or_none(config.get("block_size")),
    taps_key=speculators.AUX_IDS_KEY, to_native_taps=lambda ids: [taps.residual_index(i) for i in ids],
    attention_modules=("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                       "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight"),
    counterpart=speculators.speculators_counterpart,
    tap_note="speculators aux ids: id k is the residual stream after k teacher layers, the output of layer k - 1",
    markov_optional=True, anchor_layout_key="sample_from_anchor", vllm_model_class="Qwen3DSparkForCausalLM",
    trained_k=lambda config: speculators.written_speculative_tokens(config) if "block_size" in config else None,
)

#: Every draft format, by family name. CLI choices derive from it (`cli_name`).
FORMATS: dict[str, DraftFormat] = {f.name: f for f in (K3, SPECULATORS)}
#: The format commands assume when none is named (`convert`'s target, the one verify's summary leaves unsaid).
DEFAULT_FORMAT = K3


def titles(formats: Iterable[DraftFormat]) -> str:
    """`k3_dspark or speculators DSpark`: the titles of `formats`, for messages."""
    return " or ".join(f.title for f in formats)


def by_cli_name(name: str) -> DraftFormat:
    """The format a command-line name (`k3_dspark`, `speculators`) stands for.

    Raises:
        KeyError: no format has that name.
    """
    found = next((f for f in FORMATS.values() if f.cli_name == name), None)
    if found is None:
        raise KeyError(name)
    return found

