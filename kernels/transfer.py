"""Host numbers to a device without waiting for it.

``torch.tensor(values, device="cuda")`` copies from pageable memory and then synchronises the
stream: the host waits until every kernel queued so far has run. A decode round builds a few
small tensors from host numbers (branch lengths, token rows, drafts); through ``to_device``
they go through pinned memory with ``non_blocking=True``, which only queues the copy (PyTorch's
pinned allocator keeps the buffer until the copy is done). On the CPU it is a plain tensor.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

__all__ = ["to_device", "tensor_to_device"]


def tensor_to_device(t: Tensor, device: torch.device | str) -> Tensor:
    """A CPU tensor on ``device``: itself on the CPU, else queued from pinned memory (no wait)."""
    target = torch.device(device)
    if target.type == "cpu":
        return t
    if target.type == "cuda":
        return t.pin_memory().to(target, non_blocking=True)
    return t.to(target)


def to_device(values: Sequence, dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """``torch.tensor(values, dtype=dtype)`` on ``device`` (see the module docstring)."""
    return tensor_to_device(torch.tensor(values, dtype=dtype), device)
