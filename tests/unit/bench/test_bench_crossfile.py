"""The cross-file bench's holes (bench/crossfile.py): each needs a name that only a sibling module
defines and that appears nowhere before the cursor; and its tally."""

from __future__ import annotations

import ast
import random
import re
from pathlib import Path

from kspec.bench.crossfile import Cut, Tally, find_cuts, package_folders
from kspec.bench.crossfile_lsp import _holed


def test_holes_need_a_name_only_the_sibling_defines() -> None:
    packages = package_folders()
    roots = {name: folder.parent for name, folder in packages}
    cuts = find_cuts(packages, 6, random.Random(41))
    assert len(cuts) >= 8 and {cut.kind for cut in cuts} == {"line", "name"}
    assert cuts == find_cuts(packages, 6, random.Random(41))  # seeded: every run sees the same holes
    for cut in cuts:
        root = roots[cut.package]
        text = (root / cut.module).read_text()
        sibling = ast.parse((root / cut.sibling).read_text())
        defined = {n.name for n in sibling.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | {
            t.id for n in sibling.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
        }
        assert cut.name in defined and cut.sibling != cut.module
        holed = _holed(text, cut)
        before = "".join(holed.splitlines(keepends=True)[: cut.line]) + holed.splitlines()[cut.line]
        assert not re.search(rf"\b{cut.name}\b", before)  # nowhere before the cursor
        assert cut.name in cut.reference and text.splitlines()[cut.line][cut.column :] == cut.reference


def test_tally_counts_the_name_in_the_first_line_only() -> None:
    cut = Cut("p", Path("p/a.py"), Path("p/b.py"), "Impossible", "name", 3, 10, "Impossible()")
    tally = Tally()
    tally.add(cut, ["Const()", "Impossible()"], 100.0, 10.0, {"files": ["p/b.py"], "tokens": 40})
    tally.add(cut, ["x\nImpossible()"], 200.0, 20.0, {}, {"tokens": 900, "reusedTokens": 898, "prefillMs": 12.0})
    tally.add(cut, [], 300.0, 30.0, {}, {"tokens": 900, "reusedTokens": 899, "prefillMs": 8.0})
    summary = tally.summary()
    assert (summary["name_top1"], summary["name_any_of_k"], summary["exact_any_of_k"], summary["empty"]) == (0.0, 0.333, 0.333, 0.333)
    assert summary["cold_p50_ms"] == 200.0 and summary["context_tokens_mean"] == 13.3
    # the warm prefill only of the cuts whose status told it (the first told none)
    assert summary["warm_prefill_p50_ms"] == 10.0 and summary["warm_uncached_tokens_max"] == 2


def test_held_out_holes_come_from_the_packages_named() -> None:
    """`--packages`: other packages than the default set give other holes (held out from the
    ones the ranking was looked at on); a name that is not an installed package folder is left out."""
    import pytest

    from kspec.bench.crossfile import CrossFileConfig

    default = {name for name, _ in package_folders()}
    held_out = package_folders(("asyncio", "multiprocessing", "no_such_package_here", "textwrap"))  # textwrap: a module, not a package
    assert [name for name, _ in held_out] == ["asyncio", "multiprocessing"] and not default & {"asyncio", "multiprocessing"}
    cuts = find_cuts(held_out, 4, random.Random(41))
    assert cuts and {cut.package for cut in cuts} <= {"asyncio", "multiprocessing"}
    with pytest.raises(ValueError):
        CrossFileConfig(packages=())
