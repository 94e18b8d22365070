"""Document placement (kspec.engine.serve.affinity): sticky while the replica lives, spread evenly,
moved when the replica goes. Plain Python, no Ray."""

from __future__ import annotations

from collections import Counter

import pytest

from kspec.engine.serve.affinity import DocumentPlacement


def test_a_document_stays_on_its_replica():
    placement = DocumentPlacement()
    live = {"r1", "r2", "r3"}
    first = placement.choose("a.py", live)
    assert all(placement.choose("a.py", live) == first for _ in range(5))


def test_documents_spread_evenly():
    placement = DocumentPlacement()
    live = ["r1", "r2", "r3"]
    counts = Counter(placement.choose(f"doc-{index}.py", live) for index in range(100))
    assert set(counts) == set(live)
    assert max(counts.values()) - min(counts.values()) <= 1


def test_two_routers_that_saw_the_same_documents_agree():
    one, other = DocumentPlacement(), DocumentPlacement()
    live = ["r1", "r2"]
    documents = [f"doc-{index}.py" for index in range(20)]
    assert [one.choose(d, live) for d in documents] == [other.choose(d, live) for d in documents]


def test_a_dead_replicas_documents_move_and_stay_moved_others_do_not_move():
    placement = DocumentPlacement()
    live = {"r1", "r2", "r3"}
    before = {f"doc-{index}.py": placement.choose(f"doc-{index}.py", live) for index in range(30)}
    placement.forget_replica("r2")
    survivors = {"r1", "r3"}
    after = {document: placement.choose(document, survivors) for document in before}
    for document, replica in before.items():
        if replica != "r2":
            assert after[document] == replica
        else:
            assert after[document] in survivors
    # A replacement replica takes new documents, not the ones already placed on a live replica.
    replaced = survivors | {"r4"}
    assert {document: placement.choose(document, replaced) for document in before} == after
    assert placement.choose("new.py", replaced) == "r4"


def test_a_document_whose_replica_is_not_live_is_placed_again_without_forget():
    placement = DocumentPlacement()
    home = placement.choose("a.py", ["r1", "r2"])
    other = ({"r1", "r2"} - {home}).pop()
    assert placement.choose("a.py", [other]) == other
    assert placement.choose("a.py", ["r1", "r2"]) == other
    assert placement.documents_on(home) == 0 and placement.documents_on(other) == 1


def test_the_table_is_bounded_least_recently_used_first():
    placement = DocumentPlacement(max_documents=3)
    for document in ("a", "b", "c"):
        placement.choose(document, ["r1", "r2"])
    placement.choose("a", ["r1", "r2"])  # a is now the most recent
    placement.choose("d", ["r1", "r2"])
    assert len(placement) == 3
    assert placement.replica_of("b") is None and placement.replica_of("a") is not None
    assert sum(placement.documents_on(r) for r in ("r1", "r2")) == 3


def test_no_live_replica_is_an_error():
    with pytest.raises(ValueError):
        DocumentPlacement().choose("a.py", [])
