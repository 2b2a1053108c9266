"""The format core: what a draft checkpoint is (k3_dspark, speculators DSpark), read and written
strictly, with no torch.

- `reader`: the strict safetensors header reader and its dtype table.
- `jsonio`: the one strict JSON loader (duplicate keys and NaN refused).
- `contract`: the `k3_dspark` contract as data (reference config, roster, sizes).
- `roster_k3_dspark`: the tensor roster as one function of the config, shared with the model
  (stdlib only; `export-code` ships it beside the modeling files).
- `speculators`: the speculators-format DSpark contract (roster from its config, parameter counts).
- `registry`: the draft formats as one registry (`DraftFormat`); the only place that dispatches on a format.
- `taps`: the tap-id rule (`target_layer_ids`, speculators aux ids) and its conventions.
- `checkpoint`: checkpoint sources (a local folder) opened into a `CheckpointView` of headers.
- `remote`: the Hub as a checkpoint source (HTTP range reads; huggingface_hub imported lazily).
- `digests`: the one file-digest type, hashing, and the reader of digest files.
- `tensorio`: streaming tensor bytes out of safetensors files.
- `writer`: atomic writes and the safetensors writer.

Imports nothing above itself: only `errors`, `report`, `progress` and `schemas`.
"""
