"""Prompt building (FIM templates, budgets, token healing) and the line/block stop rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kspec.engine.decode.healing import HealingBias, consume, split_for_healing
from kspec.engine.prompt import FRESH_SHARE, PromptBudget, PromptStarts, build_prompt
from kspec.engine.decode.stopping import StopRule, rule_for_cursor
from kspec.engine.models.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(random_llama_dir: Path) -> Tokenizer:
    return Tokenizer.from_folder(random_llama_dir)


@pytest.fixture(scope="module")
def fim_tokenizer(random_llama_dir: Path, tmp_path_factory) -> Tokenizer:
    """The default tokenizer plus Qwen2.5-Coder's FIM tokens."""
    data = json.loads((random_llama_dir / "tokenizer.json").read_text())
    base = len(data["model"]["vocab"])
    for offset, content in enumerate(("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")):
        data["added_tokens"].append(
            {"id": base + offset, "content": content, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        )
    folder = tmp_path_factory.mktemp("fim")
    (folder / "tokenizer.json").write_text(json.dumps(data))
    return Tokenizer.from_folder(folder)


def test_prefix_only_prompt_without_fim(tokenizer: Tokenizer):
    prompt = build_prompt(tokenizer, "def f(x):\n    return x", "\n\nprint(f(1))\n", PromptBudget(64))
    assert not prompt.uses_fim
    assert tokenizer.decode(prompt.ids) + prompt.healed_text == "def f(x):\n    return x"


def test_fim_prompt_in_psm_order(fim_tokenizer: Tokenizer):
    fim = fim_tokenizer.fim
    assert fim is not None
    prompt = build_prompt(fim_tokenizer, "def f(x):\n    return ", "\n\nprint(f(1))\n", PromptBudget(64))
    assert prompt.uses_fim
    assert prompt.ids[0] == fim.prefix and prompt.ids[-1] == fim.middle
    suffix_at = prompt.ids.index(fim.suffix)
    assert fim_tokenizer.decode(prompt.ids[suffix_at + 1 : -1]) == "\n\nprint(f(1))\n"


def test_the_suffix_takes_its_share_or_its_cap_whichever_is_less(fim_tokenizer: Tokenizer):
    fim = fim_tokenizer.fim
    assert fim is not None
    prefix, suffix = "def f(x):\n    return ", "".join(f"print(f({i}))\n" for i in range(200))

    def suffix_ids(budget: PromptBudget) -> list[int]:
        ids = build_prompt(fim_tokenizer, prefix, suffix, budget).ids
        return ids[ids.index(fim.suffix) + 1 : -1]

    assert len(suffix_ids(PromptBudget(256))) == 64  # its share, a quarter
    capped = suffix_ids(PromptBudget(256, suffix_tokens=20))
    assert len(capped) == 20 and suffix.startswith(fim_tokenizer.decode(capped))  # the text right after the cursor
    assert len(suffix_ids(PromptBudget(256, suffix_tokens=100))) == 64
    with pytest.raises(ValueError):
        PromptBudget(256, suffix_tokens=-1)


def test_budget_keeps_the_end_of_the_prefix(tokenizer: Tokenizer):
    prefix = "".join(f"line_{i} = {i}\n" for i in range(500))
    prompt = build_prompt(tokenizer, prefix, "", PromptBudget(100))
    assert len(prompt.ids) <= 100
    assert prefix.endswith(tokenizer.decode(prompt.ids) + prompt.healed_text)


def test_healing_holds_back_trailing_whitespace_and_one_word(tokenizer: Tokenizer):
    ids = tokenizer.encode("if ready:\n        ")
    kept, healed = split_for_healing(tokenizer, ids)
    assert healed.strip() and healed.endswith("        ")
    assert tokenizer.decode(kept) + healed == "if ready:\n        "


def test_healing_bias_allows_only_agreeing_tokens(tokenizer: Tokenizer):
    import torch

    bias = HealingBias(tokenizer, tokenizer.vocab_size, torch.device("cpu"))("    re")
    allowed = {tokenizer.token_texts()[i] for i in torch.nonzero(bias == 0).flatten().tolist()}
    assert allowed and all(t.startswith("    re") or "    re".startswith(t) for t in allowed)
    assert consume("    re", "  ") == "  re" and consume("    re", "    return") == ""


@pytest.mark.parametrize(
    ("prefix", "suffix", "expected"),
    [
        ("x = foo(", ")\n", StopRule(single_line=True)),
        ("def f():\n    ", "\n", StopRule(block_mode=True, block_indent=4)),
        ("def f():\n", "", StopRule(block_mode=True)),
        # the end of a line that opens a block: the body below it
        ("for item in items:", "\n", StopRule(block_mode=True, block_indent=1)),
        ("def f(items):\n    for item in items:", "\n    return 0\n", StopRule(block_mode=True, block_indent=5)),
        ("if (ready) {", "\n}\n", StopRule(block_mode=True, block_indent=1)),
        # a header being written: the rest of it and the body
        ("class Cart:\n    def total(self", "\n", StopRule(block_mode=True, block_indent=5)),
        ("class Cart:\n    def total(self", ")\n", StopRule(block_mode=True, block_indent=5)),
        ("while (x < n", ")", StopRule(block_mode=True, block_indent=1)),
        # column 0 before a line of code: a line of its own (with a body where it opens a block)
        ("def f(x):\n", "    return x\n", StopRule(single_line=True, next_code_indent=4)),
        # not headers
        ("value = compute(", "\n", StopRule(single_line=True)),
        ("done = items", "\n", StopRule(single_line=True)),
        ("match = pattern.match(text", ")\n", StopRule(single_line=True)),
        ("    def total(self", ", other)\n", StopRule(single_line=True)),
    ],
)
def test_rule_for_cursor(prefix: str, suffix: str, expected: StopRule):
    assert rule_for_cursor(prefix, suffix) == expected


def test_header_rule_keeps_the_signature_and_the_body_and_stops_after_it():
    rule = rule_for_cursor("class Cart:\n    def total(self", "\n")
    assert rule.cut(", items):\n        return sum(items)\n\n    def count(self):\n") == (", items):\n        return sum(items)", True)
    assert rule.cut(", items):\n        return sum(\n            items\n        )\n    def count(self):") == (", items):\n        return sum(\n            items\n        )", True)
    body = rule_for_cursor("def f(items):\n    for item in items:", "\n")
    assert body.cut("\n        total += item\n    return total\n") == ("\n        total += item", True)


def test_a_line_that_opens_a_block_the_code_below_is_not_the_body_of_gets_its_body():
    """HumanEval's multi-line holes: `    for i in range(n):` before `    return total` was
    cut at its newline and then dropped (a header without a body breaks the file)."""
    rule = rule_for_cursor("def f(n):\n    total = 0\n", "    return total\n")
    written = "    for i in range(n):\n        total += i\n        total *= 2\n    return total\n"
    assert rule.cut(written) == ("    for i in range(n):\n        total += i\n        total *= 2", True)
    assert rule.cut("    for i in range(n):\n        total += i") == ("    for i in range(n):\n        total += i", False)
    assert rule.cut("    for i in range(n):\n        total += i\n\n") == ("    for i in range(n):\n        total += i", True)
    assert rule.cut("    total += 1\n    for") == ("    total += 1", True)  # not a header: one line
    assert rule.cut("    result = f(x):\n  y") == ("    result = f(x):", True)  # ends with a colon, opens nothing
    # the code below is the header's body: the header alone is the line
    body_below = rule_for_cursor("def f(n):\n    total = 0\n", "        total += i\n")
    assert body_below.cut("    for i in range(n):\n        total += i\n") == ("    for i in range(n):", True)
    braces = rule_for_cursor("function f(n) {\n  let t = 0;\n", "  return t;\n}\n")
    assert braces.cut("  if (n > 0) {\n    t = n;\n  }\n  return t;") == ("  if (n > 0) {\n    t = n;\n  }", True)


def test_a_hole_before_an_else_holds_the_block_the_else_continues():
    """HumanEval/89's four-line hole before `        else:` gave nothing: each branch stopped after
    its first line (`    out = ''`), and every one line left the `else` without its `if`."""
    rule = rule_for_cursor("def encrypt(s):\n    d = 'abc'\n", "        else:\n            out += c\n    return out\n")
    assert rule.before_clause and rule.next_code_indent == 8
    written = "    out = ''\n    for c in s:\n        if c in d:\n            out += d[0]\n        else:\n            out += c\n"
    assert rule.cut(written) == ("    out = ''\n    for c in s:\n        if c in d:\n            out += d[0]", True)
    assert rule.cut("    out = ''\n    for c in s:") == ("    out = ''\n    for c in s:", False)  # still growing
    assert rule.cut("    out = ''\n\n    for c") == ("    out = ''", True)
    assert rule.cut("    out = ''\nreturn out\n") == ("    out = ''", True)  # shallower than the first line
    # a first line deeper than the clause is the body of a header above the cursor: one line
    assert rule.cut("            out += c\n        x = 1\n") == ("            out += c", True)
    braces = rule_for_cursor("function f(a) {\n  let x = 0;\n", "  } catch (e) {\n    x = 1;\n  }\n  return x;\n}\n")
    assert braces.cut("  try {\n    x = g(a);\n  } catch (e) {\n") == ("  try {\n    x = g(a);", True)
    assert not rule_for_cursor("def f(x):\n", "    return x\n").before_clause
    assert not rule_for_cursor("def f(x):\n", "    else_branch = x\n").before_clause


def test_block_rule_stops_at_dedent_and_blank_line():
    rule = StopRule(block_mode=True, block_indent=4)
    assert rule.cut("x = 1\n    y = 2\nprint(x)") == ("x = 1\n    y = 2", True)
    assert rule.cut("x = 1\n\n    y = 2") == ("x = 1", True)
    assert rule.cut("x = 1\n    y") == ("x = 1\n    y", False)
    first_line_sets_indent = StopRule(block_mode=True)
    assert first_line_sets_indent.cut("    a\n        b\n    c\nd") == ("    a\n        b\n    c", True)


def test_long_prefix_keeps_its_start_while_the_user_types(tokenizer: Tokenizer):
    prefix = "".join(f"value_{i} = compute({i}, scale={i % 7})\n" for i in range(400))
    starts = set()
    typing = "result = compute(1, scale=2)\n" * 3
    remembered = PromptStarts()
    for typed in (typing[:end] for end in range(1, len(typing), 5)):
        prompt = build_prompt(tokenizer, prefix + typed, "", PromptBudget(512), remembered)
        assert len(prompt.ids) <= 512
        text = tokenizer.decode(prompt.ids) + prompt.healed_text
        assert (prefix + typed).endswith(text)
        starts.add(text.split("\n", 1)[0])
    assert len(starts) == 1  # the prompt's first line did not move: the prefix cache can hit


def test_a_sliding_window_keeps_the_prompt_start_while_the_user_types(tokenizer: Tokenizer):
    """The language server sends the last `prefixChars` characters before the cursor: the
    window's start slides with every keystroke and crosses line ends. The prompt's start
    (a line of the file) must not move with it, or every such keystroke prefills cold."""
    prefix = "".join(f"value_{i} = compute({i}, scale={i % 7})\n" for i in range(400))
    window_chars = 6000
    typing = "result = compute(1, scale=2)\n" * 3
    remembered = PromptStarts()
    starts, sizes = set(), []
    for end in range(1, len(typing)):
        text = (prefix + typing[:end])[-window_chars:]
        prompt = build_prompt(tokenizer, text, "", PromptBudget(384), remembered)
        written = tokenizer.decode(prompt.ids) + prompt.healed_text
        assert text.endswith(written) and len(prompt.ids) <= 384
        starts.add(written.split("\n", 1)[0])
        sizes.append(len(prompt.ids))
    assert len(starts) == 1
    assert sizes[0] <= 384 * FRESH_SHARE + 1 < sizes[-1]  # a new start leaves room to type into, which fills


def test_a_prompt_start_moves_on_once_the_text_outgrows_the_budget(tokenizer: Tokenizer):
    prefix = "".join(f"value_{i} = compute({i}, scale={i % 7})\n" for i in range(400))
    remembered = PromptStarts()
    first = build_prompt(tokenizer, prefix, "", PromptBudget(128), remembered)
    grown = prefix + "".join(f"extra_{i} = {i}\n" for i in range(40))
    later = build_prompt(tokenizer, grown, "", PromptBudget(128), remembered)
    assert len(later.ids) <= 128
    first_line = (tokenizer.decode(first.ids) + first.healed_text).split("\n", 1)[0]
    assert first_line not in tokenizer.decode(later.ids)  # the old start no longer fits: a later one
    again = build_prompt(tokenizer, prefix, "", PromptBudget(128), remembered)
    assert again.ids == first.ids  # back where it was: that start is still remembered


def test_a_start_fitted_behind_other_context_is_not_taken_and_the_next_keystroke_hits_the_cache(tokenizer: Tokenizer):
    """`kspec bench quality --cross-file`: a file asked first with a small context, then with the
    sibling open (a bigger one). The start remembered from the first fitted the bigger budget
    exactly, with no room left, so the next typed character moved it and prefilled the file
    again (374 of 869 tokens). Behind a new context the start is chosen afresh, with room."""
    from kspec.engine.api import ContextFile

    prefix = "".join(f"value_{i} = compute({i}, scale={i % 7})\n" for i in range(400))
    small = (ContextFile("pkg/a.py", "def a():\n    pass\n"),)
    big = (ContextFile("pkg/b.py", "".join(f"def helper_{i}(x):\n    return x + {i}\n" for i in range(10))),)
    for tokens in range(400, 900, 3):  # whether the old start fits the new budget to the token depends on the sizes
        budget, remembered = PromptBudget(tokens), PromptStarts()
        build_prompt(tokenizer, prefix, "", budget, remembered, small, "pkg/m.py", "python")
        cold = build_prompt(tokenizer, prefix, "", budget, remembered, big, "pkg/m.py", "python")
        assert cold.context_tokens > 60
        warm = build_prompt(tokenizer, prefix + "r", "", budget, remembered, big, "pkg/m.py", "python")
        shared = next((at for at, (a, b) in enumerate(zip(cold.ids, warm.ids)) if a != b), min(len(cold.ids), len(warm.ids)))
        assert shared >= len(cold.ids) - 4, tokens  # all but the healed tail: the prefix cache holds the keystroke's prompt
