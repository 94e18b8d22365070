"""Typing at the end of a document: an open construct is normal there, not a broken file."""

from kspec.engine.api import Completion
from kspec.engine.syntax import postprocess

PREFIX = "import re\n\n\nclass Wrapper:\n    def __init__(self):\n        self.width = 70\n\n    def _wrap_chunks(sel"


def test_a_def_header_completed_at_the_end_of_the_document_is_shown():
    shown = postprocess(PREFIX, "", "python", [Completion("f, chunks):", logprob=-1.0, n_tokens=5, finish_reason="stop")])
    assert [c.text for c in shown] == ["f, chunks):"]


def test_the_same_header_is_dropped_when_the_budget_cut_it():
    assert postprocess(PREFIX, "", "python", [Completion("f, chunks):", logprob=-1.0, n_tokens=5, finish_reason="length")]) == []


def test_a_header_whose_body_is_missing_before_more_code_is_still_dropped():
    suffix = "\n\n    def fill(self, text):\n        return text\n"
    assert postprocess(PREFIX, suffix, "python", [Completion("f, chunks):", logprob=-1.0, n_tokens=5, finish_reason="stop")]) == []
