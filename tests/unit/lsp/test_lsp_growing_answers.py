"""After an early answer: the later answers keep the alternative shown first in front while one of
them continues it (a jump to another line needs a score gap), the status stays busy while the
engine decodes on and lists the document, the client is told whether an update is final, and
the final answer's distinct alternatives of k are in the status. With a fake engine on the loop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kspec.engine.api import Completion, CompletionRequest, CompletionResult
from kspec.engine.serve.status import Status
from kspec.lsp_server.completion_flow import STABLE_SCORE_GAP, CompletionFlow, Query, distinct_texts, keep_shown
from kspec.lsp_server.cursor_window import Budgets, editor_context
from kspec.lsp_server.documents import Cursor, Document
from kspec.lsp_server.settings import Settings
from kspec.lsp_server.status_report import StatusReport
from kspec.lsp_server.typeahead import TypeaheadCache

URI = "file:///w/best.py"


def ranked(*items: tuple[str, float]) -> list[Completion]:
    return [Completion(text, score) for text, score in items]


def texts(completions: list[Completion]) -> list[str]:
    return [c.text for c in completions]


def test_the_continuation_of_what_was_shown_stays_first() -> None:
    final = ranked(("if v > best:", -0.5), ("best = v", -0.9), ("v = 0", -1.2))
    assert texts(keep_shown(final, "best")) == ["best = v", "if v > best:", "v = 0"]


def test_a_clearly_better_alternative_may_take_the_front() -> None:
    final = ranked(("if v > best:", -0.5), ("best = v", -0.5 - STABLE_SCORE_GAP - 0.1))
    assert texts(keep_shown(final, "best")) == ["if v > best:", "best = v"]


def test_cut_back_or_gone_the_ranking_stands_or_the_shorter_stays() -> None:
    final = ranked(("return sum(v)", -0.2), ("return min(v)", -0.4))
    assert texts(keep_shown(final, "return min(v)\n    x")) == ["return min(v)", "return sum(v)"]  # trimmed back
    assert texts(keep_shown(final, "yield")) == ["return sum(v)", "return min(v)"]  # no longer a candidate
    assert texts(keep_shown(final, None)) == ["return sum(v)", "return min(v)"]


def test_distinct_texts_drop_empties_and_trailing_blank_twins() -> None:
    alternatives = ranked(("x", -1.0), ("x ", -1.1), ("", -1.2), (" x", -1.3), ("y\n", -1.4))
    assert distinct_texts(alternatives) == [alternatives[0], alternatives[3], alternatives[4]]


class GrowingEngine:
    """Answers early with `early`, then, once `release` is set, with `final`."""

    def __init__(self, early: list[Completion], final: list[Completion]) -> None:
        self.early, self.final = early, final
        self.release = asyncio.Event()
        self.requests: list[CompletionRequest] = []

    async def complete(self, request: CompletionRequest, early: Any = None) -> CompletionResult:
        self.requests.append(request)
        if early is not None:
            early(CompletionResult(self.early, "fake"))
        await self.release.wait()
        return CompletionResult(self.final, "fake")


def make_query(text: str, line: int, column: int, settings: Settings) -> Query:
    document = Document.create(URI, "python", 3, text)
    cursor = Cursor(line, column)
    context = editor_context(document, cursor, Budgets(settings.prefix_chars, settings.suffix_chars))
    return Query(document, cursor, document.lines[line].rstrip("\n"), context, settings, document.version)


async def _grow(early: list[Completion], final: list[Completion]) -> tuple[list[str], list[str], list[dict[str, Any]], list[tuple[str, Any]]]:
    statuses: list[dict[str, Any]] = []
    notes: list[tuple[str, Any]] = []
    report = StatusReport(statuses.append, dict)
    report.status = Status("ready", "ready")
    engine = GrowingEngine(early, final)
    typeahead = TypeaheadCache()
    flow = CompletionFlow(typeahead, report, lambda: engine, lambda method, params: notes.append((method, params)), lambda: {"k", "first_answer_ms"})
    flow.handles_updates = True
    settings = Settings(k=3, first_answer_ms=1.0, debounce_ms=0.0)
    query = make_query("for v in values:\n    ", 1, 4, settings)
    shown = await flow.suggest(query, debounce=False)
    assert report.activity == "busy" and statuses[-1]["decoding"] == [URI], statuses[-1]  # decoding on: busy, not idle
    engine.release.set()
    for _ in range(100):
        if report.activity != "busy":
            break
        await asyncio.sleep(0.01)
    hit = typeahead.lookup(URI, query.context, settings.prefix_chars, settings.suffix_chars)
    assert hit is not None
    return texts(shown), texts(list(hit.alternatives)), statuses, notes


@pytest.mark.asyncio
async def test_decoding_on_is_busy_and_the_final_answer_keeps_the_ghost() -> None:
    early = ranked(("best", -0.3), ("v", -0.6))
    final = ranked(("if v > best:", -0.5), ("best = v", -0.9), ("v = 0", -1.0), ("v = 0 ", -1.1))
    shown, grown, statuses, notes = await _grow(early, final)
    assert shown == ["best", "v"]
    assert grown == ["best = v", "if v > best:", "v = 0"]  # grown from what was on screen; distinct
    assert statuses[-1]["activity"] == "idle" and statuses[-1]["decoding"] == []
    assert statuses[-1]["alternatives"] == {"count": 3, "k": 3}
    assert notes[-1] == ("$/kspec/suggestionsUpdated", {"uri": URI, "version": 3, "final": True})


@pytest.mark.asyncio
async def test_the_engine_is_told_what_the_file_binds_outside_the_window() -> None:
    """A cursor far below the imports: the request carries the names the window leaves out."""
    report = StatusReport(lambda status: None, dict)
    report.status = Status("ready", "ready")
    engine = GrowingEngine([], ranked(("json.dumps(v)", -0.5)))
    engine.release.set()
    flow = CompletionFlow(TypeaheadCache(), report, lambda: engine, lambda method, params: None, lambda: set())
    settings = Settings(k=3, debounce_ms=0.0, prefix_chars=40)
    text = "import json\n\n" + "".join(f"v{i} = {i}\n" for i in range(20)) + "print(\n"
    shown = await flow.suggest(make_query(text, 22, 6, settings), debounce=False)
    assert texts(shown) == ["json.dumps(v)"]
    # the 40 characters before the cursor hold `v17` to `v19` and the end of `v16`'s line
    assert engine.requests[0].outside_names == ("json", *sorted(f"v{i}" for i in range(17)))
