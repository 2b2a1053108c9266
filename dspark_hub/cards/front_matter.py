"""A card's front matter: checked the way the Hub checks it (offline), and written in the Hub's key order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from dspark_hub.cards import hub_vocab

#: Codes of `front_matter_problems`. Append-only: tools match on them.
FRONT_MATTER_CODES: dict[str, str] = {
    "FRONT_MATTER_NOT_MAPPING": "the front matter is not a mapping",
    "METADATA_REJECTED": "huggingface_hub.ModelCardData rejects it",
    "LICENSE_MISSING": "no license",
    "LICENSE_UNKNOWN": "license is not one of the Hub's license ids",
    "LICENSE_UNNAMED": "license: other without license_name",
    "PIPELINE_TAG_UNKNOWN": "pipeline_tag is not a Hub task id",
    "BASE_MODEL_RELATION_UNKNOWN": "base_model_relation is not adapter, merge, quantized or finetune",
    "BASE_MODEL_MISSING": "base_model_relation without base_model",
    "BASE_MODEL_INVALID": "base_model is not a valid repo id",
    "NULL_ITEM": "a list has an empty (null) item",
    "NOT_STRINGS": "tags / datasets / metrics is not a string or a list of strings",
}


@dataclass(frozen=True)
class FrontMatterProblem:
    """A problem in card metadata: the key it concerns, a stable code, severity and message."""

    key: str
    code: str
    severity: Literal["error", "warning"]
    message: str


def front_matter_problems(data: Any) -> list[FrontMatterProblem]:
    """Check card metadata the way the Hub does, offline.

    Uses `huggingface_hub.ModelCardData` (parses `model-index`, eval results) and its repo-id
    validator, plus the Hub's closed vocabularies in `hub_vocab` for license, pipeline tag and
    base-model relation, which `ModelCardData` accepts as any string.
    """
    from huggingface_hub import ModelCardData  # 0.4 s to import, and a module-level ban (TID253)
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    P = FrontMatterProblem
    if not isinstance(data, dict):
        return [P("front_matter", "FRONT_MATTER_NOT_MAPPING", "error",
                  f"front matter is a YAML {type(data).__name__}, not a mapping")]
    problems: list[FrontMatterProblem] = []
    try:
        ModelCardData(**{k: v for k, v in data.items() if k != "ignore_metadata_errors"})
    except (ValueError, TypeError) as e:
        problems.append(P("model-index", "METADATA_REJECTED", "error", f"huggingface_hub rejects the metadata: {e}"))
    license_id = data.get("license")
    if license_id is None:
        problems.append(P("license", "LICENSE_MISSING", "warning", "no license; the Hub shows the model as unlicensed"))
    elif license_id not in hub_vocab.KNOWN_LICENSES:
        problems.append(P("license", "LICENSE_UNKNOWN", "error", f"license {license_id!r} is not a Hub license id; "
                          "use an id from the Hub's license list (e.g. apache-2.0, mit) or 'other' with license_name"))
    elif license_id == "other" and not data.get("license_name"):
        problems.append(P("license", "LICENSE_UNNAMED", "warning", "license 'other' without license_name; the Hub "
                          "asks for a name (and a LICENSE file or license_link)"))
    tag = data.get("pipeline_tag")
    if tag is not None and tag not in hub_vocab.PIPELINE_TAGS:
        problems.append(P("pipeline_tag", "PIPELINE_TAG_UNKNOWN", "error",
                          f"pipeline_tag {tag!r} is not a Hub task id (e.g. text-generation)"))
    relation = data.get("base_model_relation")
    if relation is not None and relation not in hub_vocab.BASE_MODEL_RELATIONS:
        problems.append(P("base_model_relation", "BASE_MODEL_RELATION_UNKNOWN", "error", f"base_model_relation "
                          f"{relation!r} is not one of {', '.join(sorted(hub_vocab.BASE_MODEL_RELATIONS))}"))
    if relation is not None and not data.get("base_model"):
        problems.append(P("base_model_relation", "BASE_MODEL_MISSING", "error",
                          "base_model_relation without base_model"))
    bases = data.get("base_model")
    for base in ([bases] if isinstance(bases, str) else bases if isinstance(bases, list) else []):
        try:
            validate_repo_id(base)
        except (HFValidationError, TypeError) as e:
            problems.append(P("base_model", "BASE_MODEL_INVALID", "error", f"base_model {base!r} is not a Hub repo id "
                              f"({e})"))
    for key, value in data.items():
        if isinstance(value, list) and any(v is None for v in value):
            problems.append(P(key, "NULL_ITEM", "error", f"{key} lists an empty (null) item; the Hub rejects it"))
        elif key in ("tags", "datasets", "metrics") and value is not None and not (
                isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
            problems.append(P(key, "NOT_STRINGS", "error", f"{key} must be a string or a list of strings"))
    return problems


def front_matter_yaml(data: Mapping[str, Any]) -> str:
    """The front matter body (no `---` lines): Hub keys in a fixed order, lists indented."""
    class _Dumper(yaml.SafeDumper):
        def increase_indent(self, flow: bool = False, indentless: bool = False) -> Any:
            return super().increase_indent(flow, False)

    order = {k: i for i, k in enumerate(hub_vocab.FRONT_MATTER_ORDER)}
    ordered = dict(sorted(data.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))
    return yaml.dump(ordered, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False,
                     width=1000)
