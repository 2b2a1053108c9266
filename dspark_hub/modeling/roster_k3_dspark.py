"""`modeling_k3_dspark.py` imports the roster relatively (`from .roster_k3_dspark import ...`), as it
does in a checkpoint folder, where `export-code` ships `dspark_hub/format/roster_k3_dspark.py`
under this name. In the package, the one source is the format core's."""

from dspark_hub.format.roster_k3_dspark import (
    HEAD_FLAG_DEFAULT,
    confidence_head_enabled,
    confidence_head_width,
    confidence_head_with_markov,
    layer_shapes,
    tensor_shapes,
)

__all__ = ["HEAD_FLAG_DEFAULT", "confidence_head_enabled", "confidence_head_width", "confidence_head_with_markov",
           "layer_shapes", "tensor_shapes"]
