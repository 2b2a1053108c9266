"""The one reader of tensor bytes from a target's or a data folder's safetensors file: the header read strictly
(`format.reader`), the bytes through `format.folder.open_regular` (non-blocking, checked regular), never by a
native library opening the path itself, so a FIFO swapped in for a file cannot block the process where SIGTERM
cannot reach it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dspark_hub.errors import CheckpointFormatError, UsageError
from dspark_hub.format.folder import open_regular
from dspark_hub.format.reader import SafetensorsHeader, read_header

if TYPE_CHECKING:
    import torch

#: safetensors dtype -> torch dtype name, for the tensors data and target files hold.
_TORCH_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
                 "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
                 "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def _torch_dtype(dtype: str, path: str | os.PathLike[str], name: str) -> torch.dtype:
    import torch

    if dtype not in _TORCH_DTYPES:
        raise UsageError(f"{path}: tensor {name!r} is {dtype}, which is not read here; store it as "
                         f"{', '.join(sorted(_TORCH_DTYPES))}")
    found: torch.dtype = getattr(torch, _TORCH_DTYPES[dtype])
    return found


def read_tensor(path: str | os.PathLike[str], name: str) -> torch.Tensor:
    """One tensor of a safetensors file: its header read strictly, its bytes through `open_regular`."""
    return read_tensors(path, read_header(path), [name])[0]


def read_tensors(path: str | os.PathLike[str], header: SafetensorsHeader, names: Sequence[str]) -> list[torch.Tensor]:
    """The tensors `names` of a safetensors file whose header was read strictly, read through `open_regular`.

    Raises:
        CheckpointFormatError: the file is no longer a regular file, or shorter than its header says.
    """
    import torch

    out = []
    with open_regular(path) as f:
        for name in names:
            info = header.tensors[name]
            start, end = header.absolute_range(name)
            buffer = bytearray(end - start)
            view, got = memoryview(buffer), 0
            f.seek(start)
            while got < len(buffer):
                n = f.readinto(view[got:])
                if not n:
                    raise CheckpointFormatError("FILE_CHANGED", f"ends inside tensor {name!r}; the file changed "
                                                "after its header was read", path=str(path))
                got += n
            dtype = _torch_dtype(info.dtype, path, name)
            flat = torch.frombuffer(buffer, dtype=dtype) if buffer else torch.empty(0, dtype=dtype)
            out.append(flat.reshape(info.shape))
    return out
