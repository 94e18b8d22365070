"""The cross-file bench's holes (bench/crossfile.py): each needs a name that only a sibling module
defines and that appears nowhere before the cursor; and its tally."""

from __future__ import annotations

import ast
import random
import re
from pathlib import Path

import pytest

from kspec.bench.crossfile import Cut, Tally, find_cuts, package_folders, pool_reports
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


def test_reports_of_several_runs_pool_into_one() -> None:
    """`--cross-file --replay A,B`: the shares and percentiles over every cut of every run."""

    def report(budget: int, open_texts: list[str], warm_open: float) -> dict:
        case = {"name": "Impossible", "reference": "Impossible()", "kind": "name",
                "off": ["Const()"], "closed": [], "open": open_texts,
                "ms": {"off": [100.0, 10.0], "closed": [300.0, 30.0], "open": [200.0, warm_open]}}  # fmt: skip
        return {"config": {"holes": 1, "cuts": 1}, "machine_defaults": {"promptTokens": budget}, "cases": [case]}

    pooled = pool_reports([report(968, ["Impossible()"], 11.0), report(1131, ["Const()", "Impossible(1)"], 13.0)])
    assert [run["prompt_tokens"] for run in pooled["runs"]] == [968, 1131]
    opened = pooled["name"]["open"]
    assert (opened["cuts"], opened["name_top1"], opened["name_any_of_k"], opened["exact_top1"]) == (2, 0.5, 1.0, 0.5)
    assert pooled["name"]["closed"]["empty"] == 1.0 and pooled["line"]["open"]["cuts"] == 0
    assert pooled["all"]["open"]["warm_p50_ms"] == 12.0 and pooled["warm_p95_open_over_off"] == 1.29
    with pytest.raises(ValueError, match="per-cut latencies"):
        pool_reports([{"config": {}, "cases": [{"name": "x"}]}])
