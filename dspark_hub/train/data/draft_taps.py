"""What a draft config says about the target's states it reads, in the keys rollouts and data readers use.

Rollouts and the hidden-state readers (`train.data.rollouts`, `train.data.hidden_state_files`) speak in a
k3_dspark config's keys: `target_layer_ids` (OUR tap convention), `target_hidden_size`,
`target_num_hidden_layers`, `vocab_size`. A k3_dspark config has them; another registered
format's config is read through its `DraftFormat.pairing_keys`, whose taps come from
`format.taps` (for a speculators DSpark: `aux_hidden_state_layer_ids` through `taps_from_aux_ids`,
the one conversion). `tap_view` builds those keys from the draft config and the target's config
(a speculators config does not record the target's depth), refusing, in one line naming the key,
a target whose hidden size or vocabulary differs or a tap the target cannot give.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dspark_hub.errors import TargetMismatchError, UsageError
from dspark_hub.format.jsonio import is_int, json_type
from dspark_hub.format.taps import require_tap_layers, text_config


def tap_view(draft: Mapping[str, Any], target_config: Mapping[str, Any], *, where: str,
             target: str = "target", param: str = "draft_config") -> dict[str, Any]:
    """The draft's taps and target keys as a k3_dspark config spells them (a k3_dspark config: itself).

    Args:
        draft: the draft's `config.json`.
        target_config: the target's `config.json`.
        where: the draft config's path, for messages.
        target: the target's name, for messages.
        param: the argument that named the draft (`draft_config` for rollouts, `draft` for eval).

    Raises:
        UsageError: the draft is of no registered format, or a tap the target has no layer for.
        TargetMismatchError: the target's hidden size or vocabulary differs (naming the draft's key).
    """
    from dspark_hub.verify.family import detect

    fmt, found = detect(draft)
    if fmt is None:
        raise UsageError(f"{where}: a {found.spec.title} draft config; rollouts and finetune read the taps of a "
                         "k3_dspark or a speculators DSpark config", param=param)
    if fmt.trainable:
        check_target_matches(target_config, draft, target_name=target)
        return dict(draft)
    keys = fmt.pairing_keys(draft)
    text = text_config(target_config)
    for have, want, key, theirs in ((text.get("hidden_size"), keys.tap_width, keys.tap_width_key, "hidden_size"),
                                    (text.get("vocab_size"), keys.vocab_size, keys.vocab_key, "vocab_size")):
        if have != want:
            raise TargetMismatchError(f"{target}: {theirs} is {have}, the draft's {key} is {want} ({where}); pair "
                                       "the draft with the target it was trained against")
    layers = text.get("num_hidden_layers")
    if not is_int(layers):
        raise UsageError(f"{target}: its config.json has no num_hidden_layers to place the draft's taps in; pass a "
                         "transformers causal LM folder", param="target")
    bad = [f for f in fmt.tap_findings(draft, layers) if f.severity == "error"]
    if keys.taps is None or bad or min(keys.taps) < 0:
        why = bad[0].message if bad else (f"{keys.taps_key} is {keys.native_taps}; id 0 (the embedding output) is no "
                                          "layer output the target's hooks capture")
        raise UsageError(f"{where}: {why}", param=param)
    view = {"target_layer_ids": list(keys.taps), "num_target_layers": len(keys.taps),
            "target_hidden_size": keys.tap_width, "target_num_hidden_layers": layers,
            "vocab_size": keys.vocab_size, "draft_vocab_size": keys.vocab_size}
    check_target_matches(target_config, view, target_name=target)    # the tap rule, the one `verify` applies
    return view


def check_target_matches(target_config: Mapping[str, Any], draft_config: Mapping[str, Any], *,
                         target_name: str = "target") -> list[int]:
    """Refuse a target whose hidden size, layer count or vocabulary disagree with the draft config.

    Returns:
        The draft's tap ids (checked by `format.taps`, the rule `verify` applies).

    Raises:
        UsageError: either config is not an object, or `target_layer_ids` break the tap rule.
        TargetMismatchError: one line naming the first disagreeing key.
    """
    if not isinstance(draft_config, Mapping):
        raise UsageError(f"the draft's config is a JSON {json_type(draft_config)}, not an object; "
                         "pass the draft's config.json file")
    if not isinstance(target_config, Mapping):
        raise UsageError(f"{target_name}: config.json is a JSON {json_type(target_config)}, not an object; "
                         "pass a transformers causal LM folder")
    target = text_config(target_config)
    pairs = (("hidden_size", "target_hidden_size"), ("num_hidden_layers", "target_num_hidden_layers"),
             ("vocab_size", "vocab_size"), ("vocab_size", "draft_vocab_size"))
    for target_key, draft_key in pairs:
        have, want = target.get(target_key), draft_config.get(draft_key)
        if have != want:
            raise TargetMismatchError(
                f"{target_name}: {target_key} is {have}, the draft's {draft_key} is {want}; "
                "pair the draft with the target it was built for")
    return require_tap_layers(draft_config, target_layers=target["num_hidden_layers"])
