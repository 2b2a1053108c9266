"""The evaluation wing: acceptance with vLLM's definitions, simulated or measured by vLLM.

- `evaluate`: `eval`, three steps composed: open the inputs, choose the drafter, count.
- `inputs`: the draft under test, the target it pairs with, the rollouts it is measured on.
- `acceptance`: the counts, vLLM's verify loop replayed, the lockstep simulation.
- `vllm_eval`, `vllm_eval_worker`: the measurement by vLLM itself, in vLLM's interpreter.

Imports the target and data wings.
"""
