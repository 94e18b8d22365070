"""`kspec bench clients`: what counts as a whole alternative, the tally, and the sampled positions."""

from __future__ import annotations

from pathlib import Path

import pytest

from kspec.bench.plain_client import ClientsConfig, body_starts, is_whole, score, summarise

DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
SOURCE = 'def count_lines(path):\n    """Lines in the file at path."""\n    '


@pytest.mark.parametrize(
    ("alternative", "whole"),
    [
        ("return len(open(path).readlines())", True),
        ("with open(path) as f:\n        return len(f.readlines())", True),
        ("if not path:", True),  # a block opened: the body is what comes next
        ("if self", False),
        ("node.", False),
        ("return len(", False),
    ],
)
def test_a_fragment_does_not_parse_in_place(alternative: str, whole: bool) -> None:
    assert is_whole(SOURCE, alternative) is whole


def test_distinct_whole_alternatives_are_counted_once() -> None:
    row = score(SOURCE, ["return 0", "return  0", "if self", "count = 0"])
    assert row == {"alternatives": 4, "distinct_whole": 2, "fragments": 1}


def test_the_summary_against_the_goal() -> None:
    rows = [
        {"ms": 100.0, "alternatives": 4, "distinct_whole": 3, "fragments": 0},
        {"ms": 4000.0, "alternatives": 0, "distinct_whole": 0, "fragments": 0},
    ]
    summary = summarise(rows, deadline_ms=3000.0)
    assert (summary["two_distinct_whole_share"], summary["goal_met"], summary["empty"], summary["within_deadline"]) == (0.5, False, 1, 1)
    assert summary["fragment_share"] == 0.0


@pytest.mark.skipif(not (DATA / "human-eval").exists(), reason="the shared evaluation data is not beside the checkout")
def test_positions_are_function_bodies_seeded() -> None:
    config = ClientsConfig(DATA, positions=5)
    starts = body_starts(config)
    assert starts == body_starts(config) and len({task for task, _ in starts}) == 5
    assert all(source.endswith("\n    ") and "def " in source for _, source in starts)


def test_a_config_without_the_data_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="missing"):
        ClientsConfig(tmp_path)
