"""postprocess: dedupe, ranking, stable order, raw mode, dropping broken suggestions."""

from __future__ import annotations

import math

import pytest

from kspec.engine.api import Completion
from kspec.engine.syntax import PostprocessConfig, RankConfig, postprocess, rank_alternatives
from kspec.engine.syntax.checks import CheckResult
from kspec.engine.syntax.rank import Signals, dedupe_key, score

PREFIX = "def total(xs):\n    t = 0\n    for x in xs:\n"
SUFFIX = "    return t\n"


def texts(completions: list[Completion]) -> list[str]:
    return [c.text for c in completions]


def test_returns_engine_api_completions_best_first() -> None:
    candidates = [
        Completion("        t += x\n    return t\n", logprob=-2.0, n_tokens=8),
        Completion("        t = t + x\n", logprob=-4.0, n_tokens=8),
    ]
    out = postprocess(PREFIX, SUFFIX, "python", candidates)
    assert all(isinstance(c, Completion) for c in out)
    assert texts(out) == ["        t += x\n", "        t = t + x\n"]
    assert out[0].score > out[1].score
    assert out[0].logprob == -2.0 and out[0].n_tokens == 8


def test_alternatives_equal_after_trimming_are_merged() -> None:
    candidates = [
        Completion("        t += x\n    return t\n", logprob=-3.0, n_tokens=8),
        Completion("        t  +=  x\n", logprob=-2.0, n_tokens=6),  # same after whitespace normalisation
        Completion("        t += x\n\n\nprint(total([1]))\n", logprob=-6.0, n_tokens=12),
        Completion("        t = t + x\n", logprob=-2.5, n_tokens=8),
    ]
    ranked = rank_alternatives(PREFIX, SUFFIX, "python", candidates)
    keys = [dedupe_key(r.completion.text) for r in ranked]
    assert len(keys) == len(set(keys)) == 2
    merged = next(r for r in ranked if r.agreeing == 3)
    assert merged.source_index == 1  # the most confident of the three represents them
    assert merged.completion.text == "        t  +=  x\n"


def test_static_errors_rank_below_clean_alternatives() -> None:
    candidates = [
        Completion("        t += undefined_thing(x)\n", logprob=-1.0, n_tokens=6),  # more likely but undefined name
        Completion("        unused = x\n", logprob=-1.0, n_tokens=6),  # unused variable
        Completion("        t += x\n", logprob=-1.5, n_tokens=6),
    ]
    ranked = rank_alternatives(PREFIX, SUFFIX, "python", candidates)
    assert ranked[0].completion.text == "        t += x\n"
    assert ranked[1].check.unused_variables == ("unused",)
    assert ranked[2].check.undefined_names == ("undefined_thing",)


def test_suggestions_that_break_the_file_are_dropped_unless_asked() -> None:
    candidates = [Completion("        t += (x\n", logprob=-0.1, n_tokens=5), Completion("        t += x\n", logprob=-2.0, n_tokens=5)]
    assert texts(postprocess(PREFIX, SUFFIX, "python", candidates)) == ["        t += x\n"]
    kept = postprocess(PREFIX, SUFFIX, "python", candidates, config=PostprocessConfig(drop_broken=False))
    assert texts(kept) == ["        t += x\n", "        t += (x\n"]  # penalised, so last


def test_a_broken_tail_falls_back_to_an_earlier_line_end() -> None:
    prefix = "def f(x):\n"
    completion = "    y = x + 1\n    z = y * 2\n    return (z\n"
    out = postprocess(prefix, "", "python", [Completion(completion, logprob=-3.0, n_tokens=20)])
    assert texts(out) == ["    y = x + 1\n    z = y * 2"]


def test_equal_scores_keep_the_engine_order() -> None:
    candidates = [Completion("a", logprob=-1.0, n_tokens=1), Completion("b", logprob=-1.0, n_tokens=1), Completion("c", logprob=-1.0, n_tokens=1)]
    # `a`, `b`, `c` are undefined names, equally penalised: the order must be the input order.
    out = texts(postprocess("a = b = c = 0\nx = ", "\n", "python", candidates))
    assert out == ["a", "b", "c"]
    assert texts(postprocess("a = b = c = 0\nx = ", "\n", "python", candidates[::-1])) == ["c", "b", "a"]


def test_raw_keeps_text_untrimmed_and_orders_by_normalised_logprob() -> None:
    candidates = [
        Completion("        t += x\n    return t\n", logprob=-4.0, n_tokens=8),  # -0.5 per token
        Completion("        t += (x\n", logprob=-1.0, n_tokens=4),  # -0.25 per token, broken: raw keeps it
    ]
    out = postprocess(PREFIX, SUFFIX, "python", candidates, raw=True)
    assert texts(out) == ["        t += (x\n", "        t += x\n    return t\n"]
    assert [c.score for c in out] == [-0.25, -0.5]


def test_raw_alternatives_are_distinct_text() -> None:
    """Branches that began with different tokens can detokenize to the same text (the OpenAI
    endpoint at temperature 0 once returned one twice): raw mode keeps the most likely one."""
    candidates = [
        Completion("ield (chunk, end)\n    end += 1", logprob=-3.0, n_tokens=6),
        Completion("ield (chunk, end)\n    end += 1", logprob=-2.0, n_tokens=5),
        Completion("ield  (chunk, end)\n    end += 1\n", logprob=-2.5, n_tokens=5),  # equal after whitespace normalisation
        Completion("ield chunk", logprob=-4.0, n_tokens=3),
    ]
    ranked = rank_alternatives("def f():\n    y", "\n", "python", candidates, raw=True)
    assert [r.completion.text for r in ranked] == ["ield (chunk, end)\n    end += 1", "ield chunk"]
    assert [r.source_index for r in ranked] == [1, 3]
    assert ranked[0].agreeing == 3


def test_nothing_to_show_gives_an_empty_list() -> None:
    assert postprocess(PREFIX, SUFFIX, "python", []) == []
    assert postprocess(PREFIX, SUFFIX, "python", [Completion("   \n", logprob=-1.0, n_tokens=2)]) == []
    assert postprocess(PREFIX, SUFFIX, "python", [Completion("    return t\n", logprob=-1.0, n_tokens=2)]) == []


def test_truncated_candidates_lose_their_last_line() -> None:
    candidate = Completion("    y = 1\n    return y +", logprob=-2.0, n_tokens=6, finish_reason="length")
    assert texts(postprocess("def f():\n", "", "python", [candidate])) == ["    y = 1"]


def test_unknown_language_and_language_ids_are_accepted() -> None:
    candidates = [Completion("a = 1\nmore\n", logprob=-1.0, n_tokens=3)]
    assert texts(postprocess("x\n", "", None, candidates)) == ["a = 1"]
    assert texts(postprocess("x\n", "", "plaintext", candidates)) == ["a = 1"]
    js = [Completion("1, 2];\nfoo();\n", logprob=-1.0, n_tokens=4)]
    assert texts(postprocess("const a = [", "];\n", "javascriptreact", js)) == ["1, 2"]


def test_score_terms() -> None:
    config = RankConfig()
    clean = CheckResult()

    def value(text: str = "x", logprob: float = -2.0, n_tokens: int = 4, check: CheckResult = clean, **kw: object) -> float:
        return score(Signals(Completion(text, logprob=logprob, n_tokens=n_tokens), check, **kw), config)  # type: ignore[arg-type]

    base = value()
    assert base == pytest.approx(-2.0 / 4**config.length_exponent + config.length_weight * math.log(2))
    assert value(check=CheckResult(syntax_errors=1)) == pytest.approx(base - 10.0)
    assert value(check=CheckResult(undefined_names=("a", "b"))) == pytest.approx(base - 4.0)
    assert value(check=CheckResult(undefined_names=("a", "b"), certainly_undefined=("a",))) == pytest.approx(base - 6.0)
    assert value(check=CheckResult(unused_variables=("a",))) == pytest.approx(base - 1.0)
    assert value(check=CheckResult(unfixed_errors=2)) == pytest.approx(base - 5.0)
    assert value(check=CheckResult(needs_defined=("msg",))) == pytest.approx(base + config.needed_name_weight)
    assert value(check=CheckResult(needs_missing=("msg",))) == pytest.approx(base - config.needed_name_weight)
    assert value(agreeing=3) == pytest.approx(base + config.agreement_weight * math.log(3))
    assert value(degenerate=True) == pytest.approx(base - config.degenerate_penalty)
    assert value("xxxxxxxx") > base
    assert value(n_tokens=0) == pytest.approx(-2.0 + config.length_weight * math.log(2))


def test_a_long_run_of_easy_tokens_does_not_outrank_a_likelier_short_answer() -> None:
    """HumanEval/124's window (Qwen2.5-Coder-0.5B): the reference `return False` at -1.27 over 5
    tokens, beside a whole `if` line at -6.73 over 38 (a higher mean per token)."""
    prefix = "def valid_date(date):\n    try:\n        month, day, year = [int(x) for x in date.split('-')]\n        if month < 1 or month > 12:\n"
    suffix = "\n    except ValueError:\n        return False\n    return True\n"
    candidates = [
        Completion("            if year % 4 == 0 and year % 100 != 0 or year % 400 == 0:\n                return True", logprob=-6.73, n_tokens=38),
        Completion("            return False", logprob=-1.27, n_tokens=5),
    ]
    shown = texts(postprocess(prefix, suffix, "python", candidates))
    assert shown[0] == "            return False"
    per_token = PostprocessConfig(rank=RankConfig(length_exponent=1.0))
    assert texts(postprocess(prefix, suffix, "python", candidates, config=per_token))[0] != shown[0]


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_rank_config_is_validated(bad: float) -> None:
    with pytest.raises(ValueError):
        RankConfig(undefined_name_penalty=bad)
    with pytest.raises(ValueError):
        RankConfig(length_exponent=bad if bad < 0 or math.isnan(bad) else 1.5)


def test_postprocess_config_is_validated() -> None:
    with pytest.raises(ValueError):
        PostprocessConfig(max_fallbacks=-1)


# ------------------------------------------------------------- holes the file needs filled

HOLE_PREFIX = "def f(xs):\n    for x in xs:\n"
HOLE_SUFFIX = "    return xs\n"  # the `for` has no body: the file is broken until the hole is filled


def test_leaving_the_hole_unfilled_is_reported_apart_from_breaking() -> None:
    comment = [Completion("        # TODO\n", logprob=-0.1, n_tokens=3)]
    assert rank_alternatives(HOLE_PREFIX, HOLE_SUFFIX, "python", comment) == []
    lenient = PostprocessConfig(drop_unfilled=False)
    ranked = rank_alternatives(HOLE_PREFIX, HOLE_SUFFIX, "python", comment, config=lenient)
    assert len(ranked) == 1  # nothing fills it, so with drop_unfilled off the comment is shown
    assert ranked[0].check.syntax_errors == 0
    assert ranked[0].check.unfixed_errors == ranked[0].check.unfixed_at_cursor == 1


@pytest.mark.parametrize(
    ("prefix", "suffix", "text", "unfixed"),
    [
        # At module level the checks parse the whole window: the error is there, not the hole's.
        ("def broken(:\n    pass\n\n\ntotal = 0\n", "print(total)\n", "total += 1\n", 1),
        # In a function below it only that function is parsed: the error is not seen at all.
        ("def broken(:\n    pass\n\n\ndef f(xs):\n    total = 0\n", "    return total\n", "    total += len(xs)\n", 0),
    ],
)
def test_an_error_elsewhere_in_the_file_does_not_hide_suggestions(prefix: str, suffix: str, text: str, unfixed: int) -> None:
    out = rank_alternatives(prefix, suffix, "python", [Completion(text, logprob=-1.0, n_tokens=5)])
    assert [r.completion.text for r in out] == [text]
    assert out[0].check.unfixed_errors == unfixed and out[0].check.unfixed_at_cursor == 0


def test_a_header_the_hole_lost_shows_up_lines_later() -> None:
    # The suffix has the body and `} else {` of an `if` whose header was the hole: the stray
    # `}` two lines down is the hole's error; a plain statement does not fill it.
    prefix = "function f(text) {\n    "
    suffix = '\n        return 1;\n    } else {\n        return 2;\n    }\n}\n'
    statement = Completion("let match = false;", logprob=-0.5, n_tokens=5)
    header = Completion("if (text.length > 0) {", logprob=-2.0, n_tokens=9)
    assert texts(postprocess(prefix, suffix, "javascript", [statement])) == []
    assert texts(postprocess(prefix, suffix, "javascript", [statement, header])) == ["if (text.length > 0) {"]


def test_alternatives_that_leave_the_hole_unfilled_go_when_another_fills_it() -> None:
    candidates = [Completion("        # TODO\n", logprob=-0.1, n_tokens=3), Completion("        print(x)\n", logprob=-3.0, n_tokens=5)]
    ranked = rank_alternatives(HOLE_PREFIX, HOLE_SUFFIX, "python", candidates)
    assert [r.completion.text for r in ranked] == ["        print(x)\n"]
    kept = rank_alternatives(HOLE_PREFIX, HOLE_SUFFIX, "python", candidates, config=PostprocessConfig(drop_broken=False))
    assert [r.completion.text for r in kept] == ["        print(x)\n", "        # TODO\n"]  # penalised


def test_a_statement_cut_by_the_budget_before_it_fills_the_hole_is_dropped() -> None:
    prefix, suffix = "int f(int n) {\n    return (n == ", "\n}\n"
    cut_short = Completion("7) ? 84.0 : (n == 8) ? 90.0 :", logprob=-1.0, n_tokens=16, finish_reason="length")
    assert postprocess(prefix, suffix, "c", [cut_short]) == []
    finished = Completion("7) ? 84.0 : 0.0;", logprob=-1.0, n_tokens=8, finish_reason="stop")
    assert texts(postprocess(prefix, suffix, "c", [cut_short, finished])) == ["7) ? 84.0 : 0.0;"]


def test_a_hole_that_needs_more_than_one_statement_takes_more_lines() -> None:
    # The suffix has the loop body and its `}` but the hole lost the loop header: the first
    # statement alone leaves a stray `}`; two lines (through the header) fill the hole.
    prefix = "function f(n) {\n  let count = 0;\n  "
    suffix = "\n    count += i;\n  }\n  return count;\n}\n"
    completion = "let total = 0;\n  for (let i = 0; i < n; i++) {\n    total += i;\n  }\n"
    assert texts(postprocess(prefix, suffix, "javascript", [Completion(completion, logprob=-2.0, n_tokens=20)])) == [
        "let total = 0;\n  for (let i = 0; i < n; i++) {"
    ]


def test_where_no_cut_leaves_the_window_whole_the_one_that_fills_the_hole_is_kept() -> None:
    """HumanEval/89's window ends inside the statement after the hole's `else:` (`out +=`): no cut
    leaves that window whole, and the first statement alone (`out = ''`), which leaves the `else`
    without its `if`, was kept over the whole block that gives it one (then shown nothing)."""
    prefix, suffix = '    """Encrypt s.\n    """\n    d = \'abc\'\n', "        else:\n            out +="  # a window from a docstring's end
    block = "    out = ''\n    for c in s:\n        if c in d:\n            out += d[0]\n"
    assert [c.text for c in postprocess(prefix, suffix, "python", [Completion(block, logprob=-2.0, n_tokens=20)])] == [block]


def test_cpython_judges_what_tree_sitter_python_accepts() -> None:
    # tree-sitter-python accepts a non-default parameter after a default one; CPython does not.
    prefix, suffix = "def f(", "):\n    return a\n"
    out = rank_alternatives(prefix, suffix, "python", [Completion("a=1, b", logprob=-1.0, n_tokens=4), Completion("a, b=1", logprob=-2.0, n_tokens=4)])
    assert [r.completion.text for r in out] == ["a, b=1"]


LOOP_PREFIX, LOOP_SUFFIX = "def f(xs):\n    total = 0\n    for x in xs:\n        total += ", "\n    return total\n"


def test_branches_that_agree_on_their_first_line_outrank_a_lone_likelier_one() -> None:
    candidates = [
        Completion("x * x\n    return total\n", logprob=-1.0, n_tokens=4),  # -0.25 per token, alone
        Completion("x\n    return total\n", logprob=-1.2, n_tokens=4),  # -0.3 per token; three branches write `x`
        Completion("x\n\n    return total\n", logprob=-1.3, n_tokens=4),
        Completion("x\n    print(total)\n", logprob=-1.3, n_tokens=4),
    ]
    ranked = rank_alternatives(LOOP_PREFIX, LOOP_SUFFIX, "python", candidates)
    assert [r.completion.text for r in ranked] == ["x", "x * x"]
    assert ranked[0].agreeing == 3 and ranked[0].source_index == 1


def test_the_same_total_log_probability_over_more_tokens_is_more_confident() -> None:
    # per token at length_exponent 1; still so at 0.7 (a total over n tokens counts as total / n ** 0.7)
    candidates = [Completion("x + 1", logprob=-2.0, n_tokens=2), Completion("x - 1", logprob=-2.0, n_tokens=8)]
    assert texts(postprocess(LOOP_PREFIX, LOOP_SUFFIX, "python", candidates)) == ["x - 1", "x + 1"]

