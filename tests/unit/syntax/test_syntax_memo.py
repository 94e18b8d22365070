"""Per-request memos: a request's window is analysed once, however often it is post-processed."""

from __future__ import annotations

from kspec.engine.api import Completion
from kspec.engine.syntax import forget_requests, postprocess
from kspec.engine.syntax.postprocess import analysis

PREFIX = "def total(values):\n    result = 0\n    for value in values:\n        "
SUFFIX = "\n    return result\n"


def test_the_same_request_reuses_its_analysis_and_checks() -> None:
    candidates = [Completion("result += value", logprob=-1.0, n_tokens=4), Completion("result +=", logprob=-2.0, n_tokens=3)]
    first = postprocess(PREFIX, SUFFIX, "python", candidates)
    request = analysis(PREFIX, SUFFIX, "python")
    assert analysis(PREFIX, SUFFIX, "python") is request
    assert postprocess(PREFIX, SUFFIX, "python", candidates) == first  # an interim answer, then the final one
    assert [c.text for c in first] == ["result += value"]


def test_forget_requests_starts_again_from_nothing() -> None:
    request = analysis(PREFIX, SUFFIX, "python")
    forget_requests()
    again = analysis(PREFIX, SUFFIX, "python")
    assert again is not request
    assert again.check("result += value", True) == request.check("result += value", True)
