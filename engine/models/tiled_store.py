"""The CPU fast path's kernel forms kept on disk: what kspec's kernel multiplies (its tiled codes
and float16 parameters, `TiledTerm`) is built from a converted GGUF's 4-bit codes once, saved next
to them, and memory-mapped by later starts: no unpacking, no relayout, no copy at load.

One file per converted model and kernel build (`store_path`), named by what its layout depends
on: the 4-bit file it was built from (size, mtime), the build's instruction set and the source of
the module that lays the codes out. A file that cannot be read is a miss: the load converts, as
without one, and writes it again.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import tempfile
from pathlib import Path
from typing import Mapping

import torch

from kspec.engine.models import quantized
from kspec.engine.models.quantized import CpuLinear, Q4Q8Matmul, Q4Q8Term, Q5Q8Term, Q6Q8Term, Q8Q8Term, TiledTerm

FORMS: dict[str, type[TiledTerm]] = {form.__name__: form for form in (Q4Q8Term, Q8Q8Term, Q5Q8Term, Q6Q8Term)}
STORE_FORMAT = "kspec-tiled-v1"


def store_path(q4_file: Path, isa: str) -> Path:
    """Where the forms built from `q4_file` by a build for `isa` are kept."""
    stat = q4_file.stat()
    layout_source = inspect.getsource(quantized)  # the forms' classes and the helpers that lay them out
    identity = json.dumps([STORE_FORMAT, stat.st_size, stat.st_mtime_ns, isa, layout_source])
    return q4_file.with_name(f"tiled-{isa}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.pt")


class TiledStore:
    """The forms of every linear layer an earlier load built, by the layer's key."""

    def __init__(self, layout: Mapping[str, list[tuple[str, int]]], tensors: Mapping[str, torch.Tensor]):
        self.layout, self.tensors = layout, tensors

    @classmethod
    def open(cls, path: Path) -> "TiledStore | None":
        """The store at `path`, memory-mapped; None where there is none or it cannot be read."""
        try:
            saved = torch.load(path, mmap=True, weights_only=True)
            if saved.get("format") != STORE_FORMAT:
                return None
            return cls(json.loads(saved["layout"]), saved["tensors"])
        except (OSError, RuntimeError, ValueError, KeyError, AttributeError, EOFError):
            return None

    def terms(self, key: str, matmuls: Mapping[str, Q4Q8Matmul | None]) -> list[TiledTerm] | None:
        """The layer's terms (`matmuls` by form name), None where the store has none for it or this
        build lacks a form's kernel."""
        forms = self.layout.get(key)
        if not forms or any(matmuls.get(form) is None or form not in FORMS for form, _ in forms):
            return None
        return [
            FORMS[form].from_layout(self.tensors[f"{key}.{i}.codes"], self.tensors[f"{key}.{i}.params"], out, matmuls[form])  # type: ignore[arg-type]
            for i, (form, out) in enumerate(forms)
        ]

    @staticmethod
    def save(path: Path, linears: Mapping[str, CpuLinear]) -> None:
        """Keep the tiled terms of `linears` (by key); best effort: a store that cannot be written
        costs the next start a conversion, nothing else."""
        layout: dict[str, list[tuple[str, int]]] = {}
        tensors: dict[str, torch.Tensor] = {}
        for key, linear in linears.items():
            terms = list(linear.terms)
            if not terms or not all(isinstance(term, TiledTerm) for term in terms):
                continue
            layout[key] = [(type(term).__name__, term.out_features) for term in terms]
            for i, term in enumerate(terms):
                tensors[f"{key}.{i}.codes"], tensors[f"{key}.{i}.params"] = term.codes, term.params
        if not layout:
            return
        try:
            descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        except OSError:
            return
        os.close(descriptor)
        try:
            torch.save({"format": STORE_FORMAT, "layout": json.dumps(layout), "tensors": tensors}, temporary)
            os.replace(temporary, path)
        except (OSError, RuntimeError):
            Path(temporary).unlink(missing_ok=True)
            return
        for older in path.parent.glob(f"tiled-{path.name.split('-')[1]}-*.pt"):  # built from an older 4-bit file
            if older != path:
                older.unlink(missing_ok=True)
