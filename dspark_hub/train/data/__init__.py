"""The data wing: what a draft trains and is measured on, read from or written to disk.

- `rollouts`: the target's greedy continuations with their states, in resumable shards.
- `hidden_state_files`: vLLM-extraction and speculators hidden-state files read as rollouts.
- `draft_taps`: a draft config's taps and target keys in the spelling the readers use.

Imports the target wing only.
"""
