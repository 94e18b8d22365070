"""Reading safetensors files one tensor at a time with plain file reads (or, for a table read a
few rows at a time, a map of its pages: `TensorFile.mapped`).

`safetensors.safe_open` memory-maps the file: every page a load touches then sits in the
resident set next to the tensors copied out of it (a float32 checkpoint peaked at twice its
size). Reading each tensor's bytes into its own buffer keeps the peak at the model itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


class TensorFile:
    """An open safetensors file: its header, and each tensor read when asked for.
    Errors (OSError, ValueError, KeyError) are the caller's to turn into a message."""

    def __init__(self, path: Path):
        self.path = path
        self._handle: BinaryIO = path.open("rb")
        try:
            size = int.from_bytes(self._handle.read(8), "little")
            header: dict[str, Any] = json.loads(self._handle.read(size))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self._handle.close()
            raise ValueError(f"not a safetensors header ({exc})") from exc
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self._entries = header
        self._data_start = 8 + size

    def __enter__(self) -> "TensorFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()

    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> list[int]:
        """A tensor's shape, from the header: nothing read."""
        return list(self._entries[name]["shape"])

    def get(self, name: str) -> torch.Tensor:
        """One tensor, in the file's dtype, in memory of its own."""
        entry = self._entries[name]
        tensor = torch.empty(entry["shape"], dtype=DTYPES[entry["dtype"]])
        begin, end = entry["data_offsets"]
        if tensor.nbytes != end - begin:
            raise ValueError(f"tensor {name}: {end - begin} bytes for shape {entry['shape']}")
        self._handle.seek(self._data_start + begin)
        if tensor.nbytes and self._handle.readinto(memoryview(tensor.view(-1).view(torch.uint8).numpy())) != tensor.nbytes:
            raise ValueError(f"tensor {name}: the file ends early")
        return tensor

    def mapped(self, name: str) -> torch.Tensor:
        """One tensor viewing the file's own pages (a private, copy-on-write map): nothing is read
        now, and only the pages a caller reads become resident, counted as the file's (the kernel
        can drop them under pressure). For tables read a few rows at a time (an embedding)."""
        entry = self._entries[name]
        dtype = DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        if end == begin:
            return torch.empty(entry["shape"], dtype=dtype)
        pages = np.memmap(self.path, dtype=np.uint8, mode="c", offset=self._data_start + begin, shape=(end - begin,))
        return torch.from_numpy(pages).view(dtype).view(entry["shape"])
