"""`verify.runtimes`: what each serving runtime's loader does with a draft, by rules or by running it.

- `verdicts`: the verdict vocabulary every loader spec shares (cited rules, serving recipes, per-tensor
  verdicts) and the row-by-row comparison of rules with an executed load.
- `loaders`: `RuntimeSpec`, the loaders read in their sources (tokenspeed, SGLang, ATOM), the registry
  (`RUNTIMES`, `loaders_for`) and the walk that gives each tensor its verdict.
- `vllm_rules`: vLLM's loader for a k3_dspark draft, as rules executed against vLLM 0.32.0, and the
  module-tree lookup both vLLM loaders share.
- `speculators_rules`: vLLM's loader for a speculators DSpark, as sourced rules, and its serving command.
- `report`: `sections["runtimes"]` and the RUNTIME_* findings of `verify --runtime` (`extend_report`).
- `execute_vllm`: the engine that runs vLLM's own draft loader on CPU (`verify --execute`, the harness).
"""
