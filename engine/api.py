"""The request/response contract between editors' front ends and the engine.

Everything that talks to an engine (CLI, `kspec eval`, the language server, the daemon
protocol) uses these plain dataclasses; the daemon protocol carries them as they are
(engine/serve/wire.py decodes them by their declared types), and a request checks its own
limits wherever it is made.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from kspec.engine.errors import DeadlineExceeded, InputError

DEFAULT_SAMPLE_TEMPERATURE = 0.8  # mode "sample" with temperature 0

# The limits of one request, on every surface (CLI, LSP settings, msgpack, OpenAI API).
MAX_K = 32  # alternatives
MAX_NEW_TOKENS = 512  # tokens per alternative
MAX_STOPS = 8  # extra stop strings
MAX_STOP_CHARS = 256  # characters per stop string
MODES = ("diverse", "sample")  # see CompletionRequest.mode
MAX_CONTEXT_FILES = 64  # extra context pieces per request (other files' chunks, imported definitions)
MAX_CONTEXT_CHARS = 1 << 20  # characters of extra context per request, all pieces together
# Other files' context takes at most this share of the engine's prompt budget and the file's window
# the rest (engine/prompt.py; the language server asks for no more): the whole prompt stays what the
# machine fit prefills cold in its time, and a warm keystroke's decode rounds read no more KV than
# without context.
CONTEXT_SHARE = 0.5
SUFFIX_SHARE = 0.25  # of the prompt's token budget, the text after the cursor (a model with FIM tokens) at most
MAX_MEMBER_MODULES = 64  # modules whose member names a request carries
MAX_MEMBER_NAMES = 4096  # member names per request, all modules together


def _request_maps(data: Any, field: str, limit: int, shape: str, kind: type) -> list[Any]:
    """A request field that must be a list of at most `limit` maps (`shape` names their keys in
    the error) -> its items, an instance of `kind` taken as its map; the items are not checked yet."""
    if not isinstance(data, (list, tuple)) or len(data) > limit:
        raise InputError(f"request field {field!r} must be a list of at most {limit} {shape} maps")
    return [asdict(item) if isinstance(item, kind) else item for item in data]


@dataclass(frozen=True)
class ContextFile:
    """A piece of another file given as context: its path (shown to the model as the file's
    name) and text (a chunk or an outline of definitions, not necessarily the whole file)."""

    path: str
    text: str

    @classmethod
    def parse_all(cls, data: Any) -> "tuple[ContextFile, ...]":
        """A list of {path, text} maps (msgpack, JSON) -> the pieces; raises InputError."""
        pieces = []
        for item in _request_maps(data, "context", MAX_CONTEXT_FILES, "{path, text}", ContextFile):
            if not isinstance(item, dict) or not isinstance(item.get("path"), str) or not isinstance(item.get("text"), str):
                raise InputError("each 'context' piece must be a map with string 'path' and 'text'")
            pieces.append(cls(item["path"], item["text"]))
        if sum(len(p.text) + len(p.path) for p in pieces) > MAX_CONTEXT_CHARS:
            raise InputError(f"request field 'context' holds more than {MAX_CONTEXT_CHARS} characters")
        return tuple(pieces)


@dataclass(frozen=True)
class ModuleMembers:
    """The names a module offers (its functions, classes, constants), under the name the file
    reaches it by (`nodes` for `from jinja2 import nodes`): after `nodes.` at the cursor, some
    branches start with one of them (engine/syntax/members.py)."""

    qualifier: str
    names: tuple[str, ...]

    @classmethod
    def parse_all(cls, data: Any) -> "tuple[ModuleMembers, ...]":
        """A list of {qualifier, names} maps (msgpack, JSON) -> the modules; raises InputError."""
        modules = []
        for item in _request_maps(data, "members", MAX_MEMBER_MODULES, "{qualifier, names}", ModuleMembers):
            names = item.get("names") if isinstance(item, dict) else None
            if not isinstance(item, dict) or not isinstance(item.get("qualifier"), str) or not isinstance(names, (list, tuple)) \
                    or not all(isinstance(name, str) for name in names):  # fmt: skip
                raise InputError("each 'members' entry must be a map with a string 'qualifier' and a list of string 'names'")
            modules.append(cls(item["qualifier"], tuple(names)))
        if sum(len(m.names) for m in modules) > MAX_MEMBER_NAMES:
            raise InputError(f"request field 'members' holds more than {MAX_MEMBER_NAMES} names")
        return tuple(modules)


def goes_on_name(char: str) -> bool:
    """`char` can go on an identifier (a letter, digit, `_` or `$`); "" (an empty token's text)
    counts as going on too, so that such a token never ends a name. One rule for both sides of
    the contract: the engine's decoding constraints and the language server's items."""
    return char.isalnum() or char in "_$"


def spells_word(text: str, word: str) -> bool:
    """`text` writes `word` as a whole word (no letter, digit, `_` or `$` on either side)."""
    return re.search(rf"(?<![\w$]){re.escape(word)}(?![\w$])", text) is not None


def mode_for_temperature(temperature: float) -> str:
    """The mode of an API's sampling temperature (the inverse of CompletionRequest.sampling_temperature):
    0 asks for the k most likely distinct continuations, anything else for k samples."""
    return "diverse" if temperature == 0 else "sample"


@dataclass(frozen=True)
class CompletionRequest:
    """One keystroke's question: complete the text between `prefix` and `suffix`."""

    prefix: str
    suffix: str = ""
    language: str = ""  # LSP languageId ("python", "typescript", ...) or "" when unknown
    path: str = ""  # file path, for language detection and display only
    k: int = 4  # number of alternatives wanted
    max_tokens: int = 48
    mode: str = "diverse"  # "diverse": k most likely distinct first tokens, then greedy; "sample": k samples
    temperature: float = 0.0  # used by mode "sample" (0 there means DEFAULT_SAMPLE_TEMPERATURE)
    # mode "diverse", k > 1: > 0 keeps branch 0 greedy (the top suggestion as without it) and samples
    # the other k - 1 at this temperature (`top_p` applies), decoded together with it; 0: the k - 1
    # split from the greedy one at distinct first tokens or where it hesitates (engine/decode/forks.py)
    others_temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    deadline_ms: float = 5000.0  # wall-clock budget; the engine returns what is complete by then
    first_answer_ms: float = 0.0  # > 0: also answer early, with what is complete this soon, then keep decoding
    raw: bool = False  # skip trimming/ranking (for comparison)
    request_id: str = ""
    stop: tuple[str, ...] = ()  # extra stop strings: a branch ends where one first occurs (dropped)
    cursor_rules: bool = True  # end at the end of the line / block begun at the cursor; False: only stop, EOS, max_tokens
    # other files' text put before the file's own in the prompt (the repository format where the
    # model has one, file names as comments otherwise); kept apart from `prefix` so that trimming
    # and checks see only the file, and so that the prompt's stable start stays put
    context: tuple[ContextFile, ...] = ()
    members: tuple[ModuleMembers, ...] = ()  # the member names of the modules the file imports (context gatherer)
    # Python: the names the file binds at module level outside `prefix` and `suffix` (imports, functions,
    # classes, globals: `pynames.module_names`), from an editor that sends a window of a longer file;
    # the checks take them as defined (an alternative reading `json` imported above the window is not blamed)
    outside_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("stop", "outside_names"):
            if not isinstance(getattr(self, name), tuple):  # a list from JSON or msgpack
                object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "context", ContextFile.parse_all(self.context))  # maps from JSON; the limits in any case
        object.__setattr__(self, "members", ModuleMembers.parse_all(self.members))

    def after_waiting(self, waited_ms: float) -> "CompletionRequest":
        """The same request after `waited_ms` in a queue: waiting counts against its deadline
        and its early answer (due at once, not dropped, when that moment passed already)."""
        first = max(0.001, self.first_answer_ms - waited_ms) if self.first_answer_ms > 0 else 0.0
        return replace(self, deadline_ms=self.deadline_ms - waited_ms, first_answer_ms=first)

    @property
    def sampling_temperature(self) -> float:
        """The temperature the branches are sampled at: 0 in mode "diverse" (greedy after k
        distinct first tokens); in mode "sample" `temperature`, where 0 means DEFAULT_SAMPLE_TEMPERATURE."""
        if self.mode == "diverse":
            return 0.0
        return self.temperature or DEFAULT_SAMPLE_TEMPERATURE


@dataclass
class Completion:
    """One alternative: the text to insert at the cursor, what decoding said of it, and its ranking
    score. Decoding makes it (its text untrimmed, no score yet); post-processing trims the text and
    sets the score (engine/syntax/postprocess.py); the language server shows it as it came."""

    text: str
    score: float = 0.0  # engine/syntax/rank.py's score; 0 until ranked
    logprob: float = 0.0  # sum of the model's token log-probabilities
    n_tokens: int = 0
    finish_reason: str = ""  # "stop", "length", "eos", "deadline", "cancelled"


@dataclass
class CompletionResult:
    completions: list[Completion]
    model: str
    timing_ms: dict[str, float] = field(default_factory=dict)


class CancelToken:
    """Set by whoever wants a request stopped; checked by decoding every round."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


Done = Callable[[CompletionResult | None, BaseException | None], None]  # a request's outcome: exactly one of the two is set
EarlyAnswer = Callable[[CompletionResult], None]  # what was complete at `first_answer_ms`, then after each round that changed it; decoding goes on to `Done`


def admitted(request: CompletionRequest, arrived: float) -> CompletionRequest:
    """`request` as it starts now, having arrived at `arrived` (time.monotonic()): the time it
    waited counts against its deadline and its early answer. The one place a request's waiting
    is charged; DeadlineExceeded when less than a millisecond is left."""
    waited = request.after_waiting((time.monotonic() - arrived) * 1000)
    if waited.deadline_ms <= 1:
        raise DeadlineExceeded("the deadline passed while waiting for the engine")
    return waited
