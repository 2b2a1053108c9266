"""The target wing: the large model a draft serves, opened once, and the engines that run it.

- `target`: the target folder as one value (config, tokenizer, identity, lm_head, final norm),
  the pairing check against a draft config, loading the model and capturing its taps.
- `generate`: one target sequence and its states (`Rollout`), as a transformers target makes them.
- `engines`: the engine registry (`transformers`, `vllm`) and its options; `vllm_engine`,
  `vllm_worker`, `vllm_connector`: the vLLM engine, its process, its CPU connector.
- `toy`: `init-teacher`, a tiny random target for toy runs.

Imports nothing of the other wings (data, evaluation, finetuning sit above it).
"""
