"""One completion request's way through the language server, after its position became a `Query`:

  typeahead hit? answer now
  -> the user typed what a branch of the document's request still decoding has written the start
     of? wait for its next rounds: typeahead hit? answer
  -> supersede the document's older request -> debounce (automatic triggers)
  -> engine, raced against being superseded and against the deadline (`race`; one `Deadline` per
     engine request, deadline.py)
  -> early answer? the engine decodes on into the typeahead cache, the client is told
  -> cancelled by the client? the engine work goes on, unattended, for the requests that continue it.

For a client that declared `$/kspec/suggestionsUpdated` (client_kind.py), every interim answer
(from the first-answer moment on, each round that grew the branches) goes into the typeahead
cache; any other client waits for whole answers. After an early answer the later ones keep the
alternative shown first in front while one of them continues it (`keep_shown`): the ghost the
user reads grows, it does not jump to another line unless that one scores clearly better.
Nothing here holds a lock; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

from kspec.engine.api import Completion, CompletionRequest, CompletionResult, ContextFile, ModuleMembers
from kspec.engine.errors import DeadlineExceeded, EngineUnavailable, KspecError
from kspec.lsp_server.client_kind import whole_alternatives
from kspec.lsp_server.cursor_window import EditorContext
from kspec.lsp_server.deadline import Deadline
from kspec.lsp_server.documents import Cursor, Document
from kspec.lsp_server.edits import CLOSERS
from kspec.lsp_server.engine_client import EngineClient
from kspec.lsp_server.settings import Settings
from kspec.lsp_server.status_report import IDLE, TIMED_OUT, StatusReport
from kspec.lsp_server.typeahead import Entry, Hit, TypeaheadCache, typed_since

log = logging.getLogger("kspec.lsp")

UPDATED_METHOD = "$/kspec/suggestionsUpdated"  # longer alternatives for {uri, version} are in the typeahead cache
FALLBACK_FIRST_ANSWER_MS = 300.0  # when the engine chose none (a remote engine) and the user set none
MID_LINE_MAX_TOKENS = 24  # a cursor before text on its line only completes that line
INTERIM_REFRESH_MS = 300.0  # after an early answer, the client is told of grown alternatives at most this often
# A later answer puts first the alternative that continues the one shown first, unless its best
# scores this much higher (rank.py's scale: a penalty, or a clearly surer model). Measured with 0.5
# (docs/measurements/zen4-early-ghost.md): 3 more of 112 held-out answers exact, 3 fewer of 180
# typed keystrokes predicted; both within noise, so the ghost stays put as before.
STABLE_SCORE_GAP = 1.0


@dataclass
class Stats:
    requests: int = 0
    answered: int = 0  # with at least one item
    empty: int = 0
    typeahead_hits: int = 0
    engine_calls: int = 0
    superseded: int = 0  # dropped for a newer request on the same document
    cancelled: int = 0  # $/cancelRequest
    timeouts: int = 0  # no answer by the deadline (also: the engine's answer came back empty at it)
    errors: int = 0
    early_answers: int = 0  # answered at the first-answer moment while decoding went on
    continued: int = 0  # of those, final answers stored in the typeahead cache (client told)
    interim_updates: int = 0  # of those, interim answers that grew the alternatives meanwhile (client told)
    joined: int = 0  # waited for the next rounds of an older request whose branches they continue
    unattended: int = 0  # engine work that went on after its request was cancelled
    retried: int = 0  # timed-out requests answered when asked again, unattended (client told)
    refilled: int = 0  # asked for, the typeahead cache had fewer than k for the text typed since: asked the engine for k
    work_on: int = 0  # now: requests whose engine work goes on after their early answer or cancellation


@dataclass(frozen=True)
class Query:
    document: Document
    cursor: Cursor
    body: str  # the cursor's line at request time, without its terminator
    context: EditorContext
    settings: Settings
    version: int  # the document's version at request time
    extra: tuple[ContextFile, ...] = ()  # other files' pieces before the file's text (crossfile/gatherer.py)
    members: tuple[ModuleMembers, ...] = ()  # the imported modules' member names (crossfile/gatherer.py)


class Ticket:
    """The newest request of a document with the engine; set `superseded` when a newer one
    arrives that it cannot serve. While the engine decodes for it, `alternatives` are its latest
    interim ones (None before the first), and `grew` is set each time they change and when its
    engine work is over."""

    def __init__(self, query: Query | None = None) -> None:
        self.superseded = asyncio.Event()
        self.query = query
        self.alternatives: tuple[Completion, ...] | None = None
        self.over = False
        self.grew = asyncio.Event()
        self.unattended: asyncio.Future | None = None  # its engine work, going on after it was cancelled
        self.shown: str | None = None  # the first alternative the client was given (then kept first while continued)
        self.kept: Completion | None = None  # a refill's: the alternative on screen when more were asked for (stays first)

    def interim(self, alternatives: tuple[Completion, ...]) -> None:
        self.alternatives = alternatives
        self._wake()

    def finish(self) -> None:
        self.over = True
        self._wake()

    def supersede(self) -> None:
        """A newer request it cannot serve came (or its document closed): its engine work stops."""
        self.superseded.set()
        self.finish()

    def _wake(self) -> None:
        grew, self.grew = self.grew, asyncio.Event()
        grew.set()

    def may_still_write(self, query: Query) -> bool:
        """Still decoding, and `query` is its place with text typed at the cursor that some
        branch has written the start of and no further: its next interim answer may serve it."""
        mine = self.query
        if mine is None or self.alternatives is None or self.over or self.superseded.is_set() or mine.settings != query.settings:
            return False
        found = typed_since(mine.context, query.context, query.settings.prefix_chars, query.settings.suffix_chars)
        return found is not None and any(found[0].startswith(alternative.text) for alternative in self.alternatives)


async def race(futures: Iterable[asyncio.Future], ticket: Ticket, timeout_s: float) -> tuple[set[asyncio.Future], bool]:
    """Wait for the first of `futures`, for `ticket` to be superseded, or for `timeout_s`:
    (those of `futures` that are done, whether it was superseded). The one race every wait of a
    request's engine work runs."""
    superseded = asyncio.ensure_future(ticket.superseded.wait())
    try:
        done, _ = await asyncio.wait({*futures, superseded}, timeout=max(0.0, timeout_s), return_when=asyncio.FIRST_COMPLETED)
    finally:
        superseded.cancel()
    return done - {superseded}, superseded in done


class Inflight:
    """The newest request of each document with the engine (its ticket)."""

    def __init__(self) -> None:
        self.tickets: dict[str, Ticket] = {}

    def __len__(self) -> int:
        return len(self.tickets)

    def get(self, uri: str) -> Ticket | None:
        return self.tickets.get(uri)

    def supersede(self, uri: str | None = None) -> None:
        """Document `uri`'s request stops (every document's: None)."""
        tickets = list(self.tickets.values()) if uri is None else [t for t in [self.tickets.pop(uri, None)] if t]
        for ticket in tickets:
            ticket.supersede()

    def begin(self, uri: str, query: Query) -> Ticket:
        """A new request of `uri`: it supersedes the one before, and cancelled work on other documents
        (the user moved on)."""
        previous = self.tickets.get(uri)
        if previous is not None:
            previous.supersede()
        for other, ticket in self.tickets.items():
            if other != uri and ticket.unattended is not None:
                ticket.supersede()
        ticket = self.tickets[uri] = Ticket(query)
        return ticket

    def end(self, uri: str, ticket: Ticket) -> None:
        ticket.finish()
        if self.tickets.get(uri) is ticket:
            del self.tickets[uri]


class CompletionFlow:
    """The requests of one client: its documents' tickets, the typeahead cache, and the engine
    work going on for them."""

    def __init__(
        self, typeahead: TypeaheadCache, report: StatusReport, engine: Callable[[], EngineClient | None],
        notify: Callable[[str, Any], None], user_set: Callable[[], set[str]],
    ) -> None:  # fmt: skip
        self.typeahead = typeahead
        self.report = report
        self.stats = Stats()
        self.handles_updates = False  # the client declared $/kspec/suggestionsUpdated: early answers for it
        self.inflight = Inflight()
        self._engine = engine
        self._notify = notify
        self._user_set = user_set

    def choice(self, name: str, value: Any) -> Any:
        return self.report.machine_choice(name, value, self._user_set())

    async def suggest(self, query: Query, debounce: bool) -> list[Completion]:
        """The alternatives to show at `query`, best first."""
        settings, uri = query.settings, query.document.uri
        cached, k = self._cached(query), self.choice("k", settings.k)
        if cached is not None and not asks_for_more(cached, k, not debounce, self.handles_updates, self.inflight.get(uri) is not None):
            return self._served(cached)
        if cached is None and (alternatives := await self._join(query)) is not None:
            return alternatives
        ticket = self.inflight.begin(uri, query)
        if cached is not None:  # on screen: it stays first, then the engine's others (on_screen_first)
            self.stats.refilled += 1
            ticket.kept = cached.alternatives[0]
        continuing: asyncio.Future | None = None
        try:
            if debounce and settings.debounce_ms > 0:
                if (await race((), ticket, settings.debounce_ms / 1000))[1]:
                    self.stats.superseded += 1
                    return []
            alternatives, continuing = await self._ask_engine(query, ticket)
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            raise
        finally:
            continuing = continuing or ticket.unattended
            if continuing is None:
                self.inflight.end(uri, ticket)
            else:  # the request decodes on after its answer or its cancelling: a diverging request still supersedes it
                continuing.add_done_callback(lambda _: self.inflight.end(uri, ticket))
        if alternatives:
            self.stats.answered += 1
        else:
            self.stats.empty += 1
        return alternatives

    def _cached(self, query: Query) -> Hit | None:
        """The typeahead cache's answer (at most k alternatives), if it has one."""
        settings = query.settings
        at = (query.document.uri, query.context, settings.prefix_chars, settings.suffix_chars, self.choice("k", settings.k))
        return self.typeahead.lookup(*at) if settings.typeahead else None

    def _served(self, hit: Hit) -> list[Completion]:
        self.stats.typeahead_hits += 1
        self.stats.answered += 1
        self.report.set_activity(IDLE)
        return list(hit.alternatives)

    async def _join(self, query: Query) -> list[Completion] | None:
        """The user typed what a branch of the request decoding on has begun to write: its next
        rounds may serve this one, sooner than starting over would."""
        settings, pending = query.settings, self.inflight.get(query.document.uri)
        if not settings.typeahead or pending is None or not pending.may_still_write(query):
            return None
        self.stats.joined += 1
        deadline = Deadline(settings.deadline_ms)
        try:
            while pending.may_still_write(query):
                await asyncio.wait_for(pending.grew.wait(), deadline.left_s())
                if (hit := self._cached(query)) is not None:
                    return self._served(hit)
        except asyncio.TimeoutError:
            pass
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            raise
        return None

    async def _ask_engine(self, query: Query, ticket: Ticket) -> tuple[list[Completion], asyncio.Future | None]:
        """The alternatives to show now, and the request still decoding after an early answer (its
        final answer lands in the typeahead cache), if any."""
        engine = self._engine()
        if engine is None:
            return [], None
        request = engine_request(query, self.choice, self.handles_updates)
        if query.settings.debug_log:
            context = query.context
            log.debug("request at %s:%d: ...%r | %r...", query.document.uri, query.cursor.line, context.prefix[-80:], context.suffix[:40])
        self.stats.engine_calls += 1
        deadline = Deadline(request.deadline_ms)
        early: asyncio.Future = asyncio.get_running_loop().create_future()

        def on_interim(interim: CompletionResult) -> None:
            # Every interim answer (the branches grew) serves the keystrokes that follow.
            if not ticket.superseded.is_set():
                ticket.interim(tuple(self._store(query, interim, deadline, shown=False, ticket=ticket)))
            if not early.done():
                early.set_result(interim)

        # awaited: its job's end is told with its answer, when this request records it
        job = start_job(self.report, query, engine.complete(request, on_interim if request.first_answer_ms > 0 else None), awaited=True)
        done: set[asyncio.Future] = set()
        superseded = False
        outcome = IDLE  # told when this request is over (also when it was cancelled)
        try:
            try:
                done, superseded = await race({job, early}, ticket, deadline.left_s())
            except asyncio.CancelledError:
                # The client cancelled: an editor does at every keystroke, and the next request
                # may continue this one. The engine goes on for it, unattended.
                if not job.done() and not ticket.superseded.is_set():
                    ticket.unattended = asyncio.ensure_future(self._unattended(query, request, ticket, job, early, deadline))
                raise
            finally:
                if ticket.unattended is None and not done and not job.done():
                    job.cancel()  # stops the engine at its next round
            if job in done:
                alternatives = self._answered(query, request, job, deadline, ticket=ticket)
                if not alternatives and _timed_out(job, deadline):
                    self.stats.timeouts += 1
                    outcome = TIMED_OUT
                    return alternatives, self._after_timeout(query, ticket)
                return alternatives, None
            if early in done:
                alternatives = self._store(query, early.result(), deadline, kept=True, ticket=ticket)
                self.stats.early_answers += 1
                ticket.shown = alternatives[0].text if alternatives else None
                return alternatives[: request.k], asyncio.ensure_future(self._decode_on(query, request, ticket, job, deadline))
            if superseded:
                self.stats.superseded += 1
            else:
                self.stats.timeouts += 1
                outcome = TIMED_OUT
                log.info("no answer within deadlineMs (%.0f ms)", request.deadline_ms)
                return [], self._after_timeout(query, ticket)
            return [], None
        finally:
            self.report.awaiting(query.document.uri, False)
            self.report.set_activity(outcome)

    def _answered(self, query: Query, request: CompletionRequest, job: asyncio.Future, deadline: Deadline, shown: bool = True, ticket: Ticket | None = None) -> list[Completion]:
        """The final answer's alternatives (also in the typeahead cache; the status says how many of k)."""
        try:
            result = job.result()
        except (DeadlineExceeded, EngineUnavailable, KspecError) as exc:
            self.stats.errors += 1
            log.info("no completion: %s", exc)
            return []
        alternatives = self._store(query, result, deadline, shown, ticket=ticket)[: request.k]
        self.report.final_alternatives(len(alternatives), request.k)
        return alternatives

    def _store(self, query: Query, result: CompletionResult, deadline: Deadline, shown: bool = True, kept: bool = False, ticket: Ticket | None = None) -> list[Completion]:
        """An answer's alternatives as shown (`shown_alternatives`), kept in the typeahead cache (unless
        `kept` there already); the status carries its latency when it is the answer the user waited for
        (`shown`), not one decoded on after it."""
        settings = query.settings
        alternatives = shown_alternatives(result, ticket, self.handles_updates)
        if alternatives and settings.typeahead and not kept:
            self.typeahead.store(query.document.uri, Entry(query.context, settings.prefix_chars, settings.suffix_chars, tuple(alternatives)))
        if shown:
            self.report.answered(result.model, deadline.elapsed_ms(), result.timing_ms)
        return alternatives

    async def _decode_on(self, query: Query, request: CompletionRequest, ticket: Ticket, job: asyncio.Future, deadline: Deadline) -> None:
        """After an early answer: the interim answers that grew the alternatives, at most one
        per `INTERIM_REFRESH_MS`, and the final answer go into the typeahead cache and the
        client is told (it asks again and gets the longer alternatives at once: the
        suggestion grows while the user pauses); a request for this document that the
        typeahead cache cannot answer supersedes (cancels) it."""
        with work_on(self.stats):
            told = time.perf_counter()
            done: set[asyncio.Future] = set()
            superseded = False
            try:
                while True:
                    grew = asyncio.ensure_future(ticket.grew.wait())
                    try:
                        done, superseded = await race({job, grew}, ticket, deadline.left_s())
                    finally:
                        grew.cancel()
                    if grew not in done or job in done or superseded:
                        break
                    if (time.perf_counter() - told) * 1000 >= INTERIM_REFRESH_MS and not self.report.closed:
                        told = time.perf_counter()
                        self.stats.interim_updates += 1
                        self._notify(UPDATED_METHOD, updated(query, final=False))
            finally:
                if not job.done():
                    job.cancel()
            if superseded and job not in done:
                self.stats.superseded += 1
            if job not in done or job.cancelled() or job.exception() is not None:
                return
            if self._answered(query, request, job, deadline, shown=False, ticket=ticket) and not self.report.closed:
                self.stats.continued += 1
                self._notify(UPDATED_METHOD, updated(query, final=True))

    def _after_timeout(self, query: Query, ticket: Ticket) -> asyncio.Future | None:
        """Nothing by the deadline: mostly a first request at a file, the engine still reading its prompt,
        which the prefix cache keeps. Asked once more, unattended, it comes in time and a client that
        re-asks on $/kspec/suggestionsUpdated is told (seen in VS Code: else nothing till the next key)."""
        if self.handles_updates and not ticket.superseded.is_set() and not self.report.closed:
            return asyncio.ensure_future(self._retry(query, ticket))
        return None  # a plain client would never ask again

    async def _retry(self, query: Query, ticket: Ticket) -> None:
        if (engine := self._engine()) is None:
            return
        with work_on(self.stats):
            request = engine_request(query, self.choice, early_answers=False)
            deadline = Deadline(request.deadline_ms)
            job = start_job(self.report, query, engine.complete(request, None))
            if job not in (await race({job}, ticket, deadline.left_s()))[0]:
                job.cancel()
            elif self._answered(query, request, job, deadline, shown=False) and not self.report.closed:
                self.stats.retried += 1
                self._notify(UPDATED_METHOD, updated(query, final=True))

    async def _unattended(
        self, query: Query, request: CompletionRequest, ticket: Ticket, job: asyncio.Future, early: asyncio.Future, deadline: Deadline,
    ) -> None:
        """The engine work of a request the client cancelled, for the requests that continue
        it: its answers go into the typeahead cache until a request it cannot serve
        supersedes it, or its deadline passes."""
        with work_on(self.stats):
            self.stats.unattended += 1
            done: set[asyncio.Future] = set()
            superseded = False
            try:
                done, superseded = await race({job, early}, ticket, deadline.left_s())
            finally:
                if not done and not job.done():
                    job.cancel()
            if superseded and not done:
                self.stats.superseded += 1
            elif job in done and not job.cancelled():
                self._answered(query, request, job, deadline, shown=False)
            elif early in done:
                await self._decode_on(query, request, ticket, job, deadline)


def asks_for_more(hit: Hit, k: int, explicit: bool, our_editor: bool, decoding: bool) -> bool:
    """Asked for (Alt+], a trigger by hand, a re-ask) by one of our editors, the cache holds fewer
    than k alternatives because the user typed into them since the engine answered (`area(w, h)`:
    `return wi|` left 1 of 3), and nothing decodes for the document: the engine is asked for k at
    the text as typed (the user's k is what can be cycled). Only a client that re-asks on updates
    (`our_editor`) is known to ask Automatic at every keystroke; another may send Invoked (or no
    context) for every one, and the cache must serve it."""
    return explicit and our_editor and hit.typed > 0 and len(hit.alternatives) < k and not decoding


def updated(query: Query, final: bool) -> dict[str, Any]:
    """UPDATED_METHOD's params: longer alternatives for the document at the request's version are in
    the typeahead cache; `final`: the engine work for them is over (no more will come for this request)."""
    return {"uri": query.document.uri, "version": query.version, "final": final}


def engine_request(query: Query, choice: Callable[[str, Any], Any], early_answers: bool) -> CompletionRequest:
    """What the engine is asked for `query`: the settings' values, or the machine's where the user
    set none (`choice`); an early answer only for a client that takes them (`early_answers`)."""
    settings, context = query.settings, query.context
    max_tokens = choice("max_tokens", settings.max_tokens)
    first_answer = choice("first_answer_ms", settings.first_answer_ms)
    if first_answer is None:
        first_answer = FALLBACK_FIRST_ANSWER_MS
    if any(char not in CLOSERS for char in context.line_suffix):
        max_tokens = min(max_tokens, MID_LINE_MAX_TOKENS)  # text right of the cursor: only the rest of this line
        first_answer = 0.0  # such a short request answers once, when done
    return CompletionRequest(
        prefix=context.prefix,
        suffix=context.suffix,
        language=query.document.language_id,
        path=_uri_path(query.document.uri),
        k=choice("k", settings.k),
        max_tokens=max_tokens,
        mode=settings.mode,
        temperature=settings.temperature,
        deadline_ms=settings.deadline_ms,
        first_answer_ms=min(first_answer, settings.deadline_ms) if settings.typeahead and early_answers else 0.0,
        raw=settings.raw,
        context=query.extra,
        members=query.members,
        outside_names=context.outside_names,
    )


def start_job(report: StatusReport, query: Query, work: Any, awaited: bool = False) -> asyncio.Future:
    """An engine job for `query`'s document: the status is BUSY until it is over (`awaited`: a
    request awaits it and tells its end, `StatusReport.awaiting`)."""
    job = asyncio.ensure_future(work)
    report.track(query.document.uri, job, awaited)
    job.add_done_callback(_retrieved)  # superseded or shut down, nobody may read its error
    return job


def shown_alternatives(result: CompletionResult, ticket: Ticket | None, handles_updates: bool) -> list[Completion]:
    """An answer's alternatives with distinct texts for a client that re-asks on updates (else with
    their whole texts, client_kind.py); after an early answer (`ticket.shown`) the one continuing what
    the client shows stays first (`keep_shown`), and becomes what it shows; after a refill the one on
    screen stays first (`on_screen_first`)."""
    if ticket is not None and ticket.kept is not None:
        completions = on_screen_first(result.completions, ticket.kept)
    else:
        completions = keep_shown(result.completions, ticket.shown if ticket else None)
    alternatives = distinct_texts(completions) if handles_updates else whole_alternatives(completions)
    if ticket is not None and ticket.shown is not None and alternatives:
        ticket.shown = alternatives[0].text
    return alternatives


def keep_shown(completions: list[Completion], shown: str | None) -> list[Completion]:
    """`completions` (best first) with the best one that continues `shown` (the text the user was
    shown first: it starts with it, or was cut back to a start of it) moved to the front, unless
    the best scores more than STABLE_SCORE_GAP above it. None continues it: the order as ranked."""
    if not shown or not completions:
        return completions
    for index, completion in enumerate(completions):
        text = completion.text
        if text and (text.startswith(shown) or shown.startswith(text)):
            if index == 0 or completions[0].score - completion.score > STABLE_SCORE_GAP:
                return completions
            return [completion, *completions[:index], *completions[index + 1 :]]
    return completions


def on_screen_first(completions: list[Completion], kept: Completion) -> list[Completion]:
    """A refill's answer (`asks_for_more`): the alternative that was on screen when the user asked for
    more stays first, whatever the engine scores it (the engine's longer version of it where it has
    one, else itself), so that the step the user asked for goes to another one; then the engine's."""
    for index, completion in enumerate(completions):
        if completion.text.startswith(kept.text):
            return [completion, *completions[:index], *completions[index + 1 :]]
    return [kept, *completions]


def distinct_texts(completions: Iterable[Completion]) -> list[Completion]:
    """The alternatives with non-empty texts, in order, each text once (trailing blanks do not make
    another alternative: an editor shows both alike)."""
    seen: set[str] = set()
    kept: list[Completion] = []
    for completion in completions:
        if completion.text and completion.text.rstrip() not in seen:
            seen.add(completion.text.rstrip())
            kept.append(completion)
    return kept


@contextmanager
def work_on(stats: Stats) -> Iterator[None]:
    """Counts engine work that goes on after its request's answer or cancellation (`Stats.work_on`)."""
    stats.work_on += 1
    try:
        yield
    finally:
        stats.work_on -= 1


def _retrieved(job: asyncio.Future) -> None:
    """Marks an engine job's error as seen: one that ended in an error after its request
    stopped waiting (superseded, or the engine closed at shutdown) would otherwise be logged
    as "Task exception was never retrieved"."""
    if not job.cancelled():
        job.exception()


def _timed_out(job: asyncio.Future, deadline: Deadline) -> bool:
    """The engine's empty answer came at its deadline (or it said it was too late)."""
    if job.cancelled():
        return False
    if isinstance(job.exception(), DeadlineExceeded):
        return True
    return deadline.passed()


def _uri_path(uri: str) -> str:
    return uri[len("file://") :] if uri.startswith("file://") else uri
