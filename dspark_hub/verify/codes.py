"""Every finding code the `verify` checks emit, with what it means. Append-only: tools match on them.

The format core reports what it meets while reading a folder under its own codes
(`format.checkpoint.FOLDER_CODES`, `format.reader.FORMAT_CODES`); a verify report carries
those too. docs/codes.md lists all of them, generated from these dicts by `docs/generate.py`.
"""

from __future__ import annotations

from dspark_hub.report import ProblemKind
from dspark_hub.vllm.pin import PINNED_VERSION

FINDING_CODES: dict[str, str] = {
    # config (checks)
    "SPECULATORS_FORMAT": "retired: no longer emitted (a speculators DSpark is verified against its own contract)",
    "SERVING_UNSUPPORTED": f"a valid speculators checkpoint vLLM {PINNED_VERSION} will not serve as trained",
    "SERVING_TOKEN_COUNT": "a bonus-anchor speculators draft drafts block_size - 1 tokens; vLLM given no count "
                           "takes block_size",
    "RUNTIME_NO_RULES": "no loader rules of that runtime are known for the checkpoint's format",
    "DROPIN_FAMILY": "the checkpoint and the drop-in reference are of different draft families",
    "PAIRING_VERIFIER": "the verifier a speculators draft records has other architectures than the target",
    "WRONG_MODEL_TYPE": "another model type altogether",
    "FOREIGN_DRAFT_FAMILY": "another draft family (GQA DSpark, DFlash, EAGLE-3, MTP)",
    "CONFIG_RULE": "a runtime start-up rule is violated, or rope_parameters is not a well-typed YaRN block",
    "CONFIG_MISSING_KEY": "a contract key is missing",
    "CONFIG_NULL_VALUE": "a key is null",
    "FORBIDDEN_KEY": "a key that changes runtime numerics and is not in the contract",
    "DRAFT_VOCAB_PRUNED": "draft_vocab_size differs from vocab_size",
    "TORCH_DTYPE_MISMATCH": "torch_dtype disagrees with the tensors",
    # roster (checks)
    "ROSTER_UNDECIDABLE": "the config cannot produce a roster",
    "MISSING_TENSOR": "a roster tensor is absent",
    "UNEXPECTED_TENSOR": "a tensor outside the roster",
    "SHAPE_MISMATCH": "shape differs from the config's",
    "DTYPE_MISMATCH": "dtype is not BF16",
    "TRAINER_NAME": "fc/hidden_norm/norm instead of context_proj/context_norm/final_norm",
    "FOREIGN_PREFIX": "names carry model./module./_orig_mod.",
    "SHIPPED_LM_HEAD": "an lm_head.weight the runtimes skip",
    "EMPTY_METADATA": "__metadata__ is {} (crashes fastsafetensors)",
    "TENSOR_ORDER": "single-file data not in sorted-name order",
    # --drop-in (dropin)
    "DROPIN_CONFIG_KEY_MISSING": "a reference config key is missing",
    "DROPIN_CONFIG_EXTRA_KEY": "a config key the reference lacks",
    "DROPIN_CONFIG_VALUE": "a config value differs from the reference",
    "DROPIN_ALLOWED_EXTRA_KEY": "auto_map, the one extra key a drop-in may carry",
    "DROPIN_TENSOR_MISSING": "a reference tensor is missing",
    "DROPIN_TENSOR_EXTRA": "a tensor the reference lacks",
    "DROPIN_SHAPE": "a shape differs from the reference",
    "DROPIN_DTYPE": "a dtype differs from the reference",
    "DROPIN_LAYOUT": "the file layout differs from the reference",
    "DROPIN_METADATA": "the safetensors metadata differs from the reference",
    "DROPIN_FILE_SIZE": "the header or file size differs from the reference",
    # --runtime (runtimes)
    "RUNTIME_SILENT_DROP": "the runtime would drop tensors, or start with parameters never written, without an error",
    "RUNTIME_LOAD_FAILS": "the runtime raises at load (a tensor, a start-up check, or load_weights refuses the names)",
    "RUNTIME_CONFIG_REFUSED": "the runtime refuses the config at parse time, before reading any tensor",
    "RUNTIME_LOADS": "the runtime loads every tensor it needs",
    "RUNTIME_RULES_DIFFER": "the runtime's loader, executed, did otherwise than dspark-hub's rules on some rows",
    "SERVED_K_BEYOND_BLOCK": "the serving commands draft more tokens a step than the block the draft was trained "
                             "for (with an eval given, what that measured)",
    # --target (pairing, rules)
    "PAIRING_NOT_A_TARGET": "the target's config names no hidden size, layer count or vocabulary to pair with",
    "PAIRING_HIDDEN_SIZE": "hidden size differs from the target's",
    "PAIRING_LAYER_COUNT": "layer count differs from the target's",
    "PAIRING_VOCAB": "vocabulary (config or padded embedding rows) differs from the target's",
    "PAIRING_LAYER_ID": "a target layer id is out of range or the target's final layer",
    "PAIRING_MASK_TOKEN": "mask_token_id outside the vocabulary, equal to pad/eos, or ordinary text",
    "PAIRING_MASK_UNNAMED": "the target's tokenizer files do not name the mask id",
    "PAIRING_EMBEDDING": "embed_tokens.weight is not the target's embedding in the draft's dtype (bytes, or the "
                         "exact BF16 rounding of an F32/F16 target)",
    "PAIRING_NO_TARGET_EMBEDDING": "no embedding found in the target to compare",
    "PAIRING_OK": "the draft pairs with the target",
    # --against-hub (HUB_FILE_CODES)
    "HUB_FILE_MISMATCH": "a file differs from the Hub's",
    "HUB_FILE_MISSING": "a file is only on the Hub",
    "HUB_FILE_EXTRA": "a file is only local",
    # --probe (train.evaluation.probe): the weights' behaviour on the target's greedy paths
    "PROBE_TAPS": "the weights follow other taps than the config's (one layer earlier or later)",
    "PROBE_SLOT_LAYOUT": "the weights follow the other slot layout (speculators sample_from_anchor)",
    "PROBE_FINAL_NORM": "the weights were trained on the final layer's tap after the target's final norm",
    "PROBE_D2T": "the pruned vocabulary's d2t holds absolute target ids, not offsets",
    "PROBE_MARKOV": "the Markov head carries nothing the draft relies on (inert, or not the head it was trained with)",
    "PROBE_BLOCK": "the weights were trained for another number of drafted tokens than the one served",
    "PROBE_ROPE": "the RoPE rows of the weights are in the half-split order, not the contract's interleaved one",
    "PROBE_UNDETERMINED": "the probe cannot tell which value of a convention the weights follow",
    "PROBE_CONFIRMED": "the weights follow the declared value of a convention",
    # --deep, --frozen-embed (deep)
    "TENSOR_NAN": "a tensor holds NaN values",
    "TENSOR_INF": "a tensor holds infinite values",
    "TENSOR_ALL_ZERO": "a weight matrix (ndim >= 2) is all zeros",
    "FROZEN_EMBED_MISMATCH": "embed_tokens.weight is not the teacher's embedding in the draft's dtype (bytes, or "
                             "the exact BF16 rounding of an F32/F16 teacher)",
}

#: `--against-hub`: the code of each kind of file problem.
HUB_FILE_CODES: dict[ProblemKind, str] = {
    "mismatch": "HUB_FILE_MISMATCH", "missing": "HUB_FILE_MISSING", "extra": "HUB_FILE_EXTRA",
}
