"""Closed vocabularies the Hub applies to model card metadata, kept as data (stdlib only).

`huggingface_hub`'s `ModelCardData` accepts any string for `license` and `pipeline_tag`;
the Hub itself only knows the ids below, so a card is checked against them offline.

Sources:
- licenses: huggingface/hub-docs `docs/hub/repositories-licenses.md` (the `region licenses`
  table), plus the Llama 3.x ids added by hub-docs PR #1619 and its predecessors.
- pipeline tags: huggingface/huggingface.js `packages/tasks/src/pipelines.ts` (`PIPELINE_DATA` keys).
- base model relations: the Hub's model card docs (`base_model_relation`).
"""

from __future__ import annotations

KNOWN_LICENSES: frozenset[str] = frozenset({
    "apache-2.0", "mit", "openrail", "bigscience-openrail-m", "creativeml-openrail-m",
    "bigscience-bloom-rail-1.0", "bigcode-openrail-m", "afl-3.0", "artistic-2.0", "bsl-1.0", "bsd",
    "bsd-2-clause", "bsd-3-clause", "bsd-3-clause-clear", "c-uda", "cc", "cc0-1.0", "cc-by-2.0",
    "cc-by-2.5", "cc-by-3.0", "cc-by-4.0", "cc-by-sa-3.0", "cc-by-sa-4.0", "cc-by-nc-2.0",
    "cc-by-nc-3.0", "cc-by-nc-4.0", "cc-by-nd-4.0", "cc-by-nc-nd-3.0", "cc-by-nc-nd-4.0",
    "cc-by-nc-sa-2.0", "cc-by-nc-sa-3.0", "cc-by-nc-sa-4.0", "cdla-sharing-1.0",
    "cdla-permissive-1.0", "cdla-permissive-2.0", "wtfpl", "ecl-2.0", "epl-1.0", "epl-2.0",
    "etalab-2.0", "eupl-1.1", "agpl-3.0", "gfdl", "gpl", "gpl-2.0", "gpl-3.0", "lgpl", "lgpl-2.1",
    "lgpl-3.0", "isc", "lppl-1.3c", "ms-pl", "mpl-2.0", "odc-by", "odbl", "openrail++", "osl-3.0",
    "postgresql", "ofl-1.1", "ncsa", "unlicense", "zlib", "pddl", "lgpl-lr", "deepfloyd-if-license",
    "llama2", "llama3", "llama3.1", "llama3.2", "llama3.3", "gemma", "unknown", "other",
})

PIPELINE_TAGS: frozenset[str] = frozenset({
    "biology", "text-classification", "token-classification", "table-question-answering",
    "question-answering", "zero-shot-classification", "translation", "summarization",
    "feature-extraction", "text-generation", "text2text-generation", "fill-mask",
    "sentence-similarity", "text-to-speech", "text-to-audio", "automatic-speech-recognition",
    "audio-to-audio", "audio-classification", "audio-text-to-text", "voice-activity-detection",
    "depth-estimation", "image-classification", "object-detection", "image-segmentation",
    "text-to-image", "image-to-text", "image-to-image", "image-to-video",
    "unconditional-image-generation", "video-classification", "reinforcement-learning", "robotics",
    "tabular-classification", "tabular-regression", "tabular-to-text", "table-to-text",
    "multiple-choice", "text-ranking", "text-retrieval", "time-series-forecasting", "text-to-video",
    "image-text-to-text", "visual-question-answering", "document-question-answering",
    "zero-shot-image-classification", "graph-ml", "mask-generation", "zero-shot-object-detection",
    "text-to-3d", "image-to-3d", "image-feature-extraction", "video-text-to-text",
    "keypoint-detection", "visual-document-retrieval", "any-to-any", "other",
})

BASE_MODEL_RELATIONS: frozenset[str] = frozenset({"adapter", "merge", "quantized", "finetune"})

#: Front matter keys in the order cards write them; keys outside this list follow, sorted.
FRONT_MATTER_ORDER: tuple[str, ...] = (
    "language", "license", "license_name", "license_link", "library_name", "base_model",
    "base_model_relation", "new_version", "datasets", "metrics", "tags", "pipeline_tag", "inference",
    "widget", "model-index",
)
