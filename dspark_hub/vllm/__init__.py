"""vLLM, the one outside system dspark-hub runs in another process: its one home.

- `pin`: the vLLM release dspark-hub is built and tested against (`PINNED_VERSION`) and the one
  version policy every user applies (`judge_version`).
- `availability`: whether vLLM can be imported here, and the one install hint.
- `child`: a Python child process in vLLM's virtualenv (possibly another one), its JSON-lines
  protocol, its log and the mapping of its failures to `dspark_hub.errors` types.

Its users: `verify.execute_vllm` (vLLM's draft loader, executed), `train.vllm_engine` (the teacher
engine) and `train.vllm_eval` (acceptance measured by vLLM). Imports only the bottom and `format`;
never vLLM itself (the children import it).
"""
