"""Tree-sitter post-processing of completions: languages, trimming, checks, ranking.

Public API (other packages import from here):

* `detect_language(language_id, path)` -> canonical name or None
* `postprocess(prefix, suffix, language, completions, raw=False)` -> decoding's `kspec.engine.api.Completion`s
  trimmed and ranked (their `score` set)
  (prefix and suffix may be a window of the file, cut anywhere: window.py)
* `unit_complete(prefix, completion_so_far, suffix, language)` — the early-stop hook
  (`UnitPredicate` is the same with the request's context built once)
* `hole_needs(prefix, suffix, language)` / `binding_starts(needs)` — what the hole must bind,
  as the starts the decoder can force on some branches (needs.py)
* `forget_requests()` — empty the per-request memos (memo.py), so that the next call for a
  text costs what a new keystroke's does (benchmarks)
"""

from kspec.engine.syntax.checks import ANALYSIS, Checker, CheckResult
from kspec.engine.syntax.early_stop import UnitPredicate, unit_complete
from kspec.engine.syntax.languages import LANGUAGES, detect_language, normalize_language
from kspec.engine.syntax.memo import forget_requests
from kspec.engine.syntax.members import MemberNames, by_context_affinity, member_names
from kspec.engine.syntax.needs import HoleNeeds, binding_starts, hole_needs
from kspec.engine.syntax.postprocess import PostprocessConfig, postprocess, rank_alternatives
from kspec.engine.syntax.rank import RankConfig, Ranked
from kspec.engine.syntax.trim import trim

__all__ = [
    "ANALYSIS",
    "LANGUAGES",
    "MemberNames",
    "CheckResult",
    "Checker",
    "HoleNeeds",
    "PostprocessConfig",
    "RankConfig",
    "Ranked",
    "UnitPredicate",
    "detect_language",
    "binding_starts",
    "forget_requests",
    "hole_needs",
    "member_names",
    "by_context_affinity",
    "normalize_language",
    "postprocess",
    "rank_alternatives",
    "trim",
    "unit_complete",
]
