"""The CPU fast path's kernel forms kept on disk: what kspec's kernel multiplies (its tiled codes
and float16 parameters, `TiledTerm`) is built from a converted GGUF's 4-bit codes once, saved next
to them, and memory-mapped by later starts: no unpacking, no relayout, no copy at load.

One file per converted model and kernel build (`store_path`), named by what its layout depends
on: the folder of 4-bit codes it was built from (a converted GGUF's is named by the file's sha256)
and their format, the build's instruction set and the forms it runs, and the source of the module
that lays the codes out. A store that holds every weight the codes stood for (`complete`: each
projection, the head and the embedding table in a kernel form) serves a start alone, and the 4-bit
codes it was built from may then be dropped (loading.py). A file that cannot be read is a miss: the load converts, as
without one, and writes it again.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import tempfile
from pathlib import Path
from typing import Iterable, Mapping, Protocol

import torch

from kspec.engine.models import quantized
from kspec.engine.models.quantized import (
    Q4_FORMAT, Int4Embedding, PackedCodes, Q4Q8Matmul, Q4Q8Term, Q5Q8Term, Q6Q8Term, Q8Q8Term, TiledTerm,
)

FORMS: dict[str, type[TiledTerm]] = {form.__name__: form for form in (Q4Q8Term, Q8Q8Term, Q5Q8Term, Q6Q8Term)}
STORE_FORMAT = "kspec-tiled-v3"  # v2: the embedding table's form (or 4-bit terms) and the weights a store stands for; v3: symmetric forms' s alone
PACKED = "Int4Embedding"  # a table's 4-bit terms as Int4Embedding holds them


def store_path(codes_folder: Path, isa: str, forms: Iterable[str]) -> Path:
    """Where the forms built from the 4-bit codes in `codes_folder` by a build for `isa` that runs
    `forms` (cpu_profile.kernel_forms) are kept."""
    layout_source = inspect.getsource(quantized)  # the forms' classes and the helpers that lay them out
    identity = json.dumps([STORE_FORMAT, Q4_FORMAT, codes_folder.resolve().name, isa, sorted(forms), layout_source])
    return codes_folder / f"tiled-{isa}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.pt"


class HasTerms(Protocol):
    terms: Iterable[torch.nn.Module]


Kept = HasTerms | Int4Embedding  # what a store keeps: a linear's (or a table's) kernel forms, or a table's 4-bit terms


class TiledStore:
    """The forms of every linear layer (and the embedding table) an earlier load built, by the
    layer's key; `weights`: the model's weight names they stand for, `complete` where that is every
    weight a 4-bit code stood for."""

    def __init__(
        self, layout: Mapping[str, list[tuple[str, int]]], tensors: Mapping[str, torch.Tensor], weights: Iterable[str] = (), complete: bool = False
    ):  # fmt: skip
        self.layout, self.tensors = layout, tensors
        self.weights, self.complete = frozenset(weights), complete

    @classmethod
    def open(cls, path: Path) -> "TiledStore | None":
        """The store at `path`, memory-mapped; None where there is none or it cannot be read."""
        try:
            saved = torch.load(path, mmap=True, weights_only=True)
            if saved.get("format") != STORE_FORMAT:
                return None
            return cls(json.loads(saved["layout"]), saved["tensors"], json.loads(saved["weights"]), bool(saved["complete"]))
        except (OSError, RuntimeError, ValueError, KeyError, AttributeError, EOFError):
            return None

    def packed(self, key: str) -> list[PackedCodes] | None:
        """A table kept as its 4-bit terms (`Int4Embedding`'s: where no kernel form holds it exactly)."""
        forms = self.layout.get(key)
        if not forms or any(form != PACKED for form, _ in forms):
            return None
        return [PackedCodes(*(self.tensors[f"{key}.{i}.{part}"] for part in ("codes", "scale", "zero"))) for i in range(len(forms))]

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
    def save(path: Path, linears: Mapping[str, Kept], weights: Iterable[str], complete: bool) -> None:
        """Keep the tiled terms of `linears` (by key: the linear layers, the embedding table) that
        stand for the model's `weights`; best effort: a store that cannot be written costs the next
        start a conversion, nothing else."""
        layout: dict[str, list[tuple[str, int]]] = {}
        tensors: dict[str, torch.Tensor] = {}
        for key, linear in linears.items():
            if isinstance(linear, Int4Embedding):
                layout[key] = [(PACKED, linear.num_embeddings)] * linear.n_terms
                for i in range(linear.n_terms):
                    for part in ("codes", "scale", "zero"):
                        tensors[f"{key}.{i}.{part}"] = getattr(linear, f"{part}{i}")
                continue
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
            saved = {"layout": json.dumps(layout), "weights": json.dumps(sorted(weights)), "complete": complete, "tensors": tensors}
            torch.save({"format": STORE_FORMAT, **saved}, temporary)
            os.replace(temporary, path)
        except (OSError, RuntimeError):
            Path(temporary).unlink(missing_ok=True)
            return
        for older in path.parent.glob(f"tiled-{path.name.split('-')[1]}-*.pt"):  # an older layout or format
            if older != path:
                older.unlink(missing_ok=True)
