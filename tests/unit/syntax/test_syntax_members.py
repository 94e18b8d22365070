"""After `module.`: the member names some branches start with, and the names ranking counts as
undefined (engine/syntax/members.py, postprocess's `members`)."""

from __future__ import annotations

import pytest
from request_maps import parsed, through_the_wire

from kspec.engine.api import Completion, CompletionRequest, ModuleMembers
from kspec.engine.errors import InputError
from kspec.engine.syntax import by_context_affinity, member_names, postprocess
from kspec.engine.syntax.members import context_words

NODES = (ModuleMembers("nodes", ("Concat", "Const", "Node", "_private_helper")), ModuleMembers("os.path", ("join", "split")))


def test_names_after_a_qualifier_with_the_typed_start_left_out() -> None:
    found = member_names("    return nodes.", NODES)
    assert found is not None and found.qualifier == "nodes" and found.typed == ""
    assert found.rests == ("Concat", "Const", "Node")  # a private name only after a typed `_`
    assert member_names("    return nodes.Con", NODES).rests == ("cat", "st")  # type: ignore[union-attr]
    assert member_names("    return nodes._", NODES).rests == ("private_helper",)  # type: ignore[union-attr]
    assert member_names("x = os.path.jo", NODES).rests == ("in",)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "prefix",
    [
        "    return nodes",  # no dot yet
        "    return self.nodes.",  # another object's attribute of that name
        "    return other.",  # a qualifier with no members given
        "    return nodes.Concat",  # the whole name typed: nothing left to start with
        "    return nodes.Zzz",  # no member starts so
        "    return nodes.Concat(",  # not after the qualifier any more
    ],
)
def test_no_names_where_the_cursor_does_not_follow_a_known_qualifier(prefix: str) -> None:
    assert member_names(prefix, NODES) is None


def test_a_name_the_module_lacks_counts_as_undefined() -> None:
    prefix, suffix = "from pkg import nodes\n\n\ndef f(args):\n    return nodes.", "\n"
    found = member_names(prefix, NODES)
    assert found is not None
    assert found.unknown("Concat(args)") is None and found.unknown("concat(args)") == "nodes.concat"
    # the same two alternatives, the invented name the model prefers: ranking puts the member first
    candidates = [Completion("concat(args)", logprob=-1.0, n_tokens=3, finish_reason="stop"), Completion("Concat(args)", logprob=-1.5, n_tokens=3, finish_reason="stop")]
    plain = postprocess(prefix, suffix, "python", candidates)
    steered = postprocess(prefix, suffix, "python", candidates, members=found)
    assert plain[0].text == "concat(args)" and steered[0].text == "Concat(args)"


def test_members_travel_in_a_request_map_and_are_checked() -> None:
    request = CompletionRequest(prefix="nodes.", members=NODES)
    assert through_the_wire(request) == request
    assert parsed({"prefix": "x", "members": [{"qualifier": "m", "names": ["a"]}]}).members == (ModuleMembers("m", ("a",)),)
    for bad in ({"qualifier": "m"}, {"qualifier": 1, "names": []}, {"qualifier": "m", "names": [1]}, "m"):
        with pytest.raises(InputError, match="members"):
            parsed({"prefix": "x", "members": [bad]})
    with pytest.raises(InputError, match="more than"):
        parsed({"prefix": "x", "members": [{"qualifier": "m", "names": [f"n{i}" for i in range(5000)]}]})


NODE_NAMES = ("Compare", "Concat", "ContextReference", "Const", "ScopedEvalContextModifier", "EvalContext")


@pytest.mark.parametrize(
    ("prefix", "qualifier", "names", "expected"),
    [
        # the enclosing definition's name
        ("class Parser:\n    def parse_concat(self):\n        args = [1]\n        return nodes.", "nodes", NODE_NAMES, ["Concat"]),
        # the line's target; the shorter name's larger share first, then the given order
        ("def f():\n    context = nodes.", "nodes", NODE_NAMES, ["ContextReference", "EvalContext", "ScopedEvalContextModifier"]),
        # a word and its longer form (`scan` / `scanner`); the qualifier's own words do not count
        ("    def __init__(self):\n        self.scan_once = scanner.", "scanner", ("make_scanner", "py_make_scanner", "NUMBER_RE"), ["make_scanner", "py_make_scanner"]),
        # one stem, the shorter word's last letter aside (`generator` / `generate`); short words do not (`line` / `link`)
        ("    def __init__(self):\n        self.generator = tokenize.", "tokenize", ("Token", "generate_tokens", "untokenize"), ["generate_tokens"]),
        ("def f():\n    line = text.", "text", ("link", "wrap"), []),
        # a definition at the cursor's indentation or deeper does not enclose it
        ("def parse_concat():\n    pass\n\ndef other():\n    return nodes.", "nodes", NODE_NAMES, []),
        # plain words (keywords, the receiver) say nothing
        ("    def f(self):\n        return self.nodes.x or nodes.", "nodes", NODE_NAMES, []),
    ],
)
def test_member_names_that_share_a_word_with_the_code_around_the_cursor(prefix: str, qualifier: str, names: tuple[str, ...], expected: list[str]) -> None:
    assert by_context_affinity(names, context_words(prefix, qualifier)) == expected


def test_ranking_prefers_the_member_the_code_around_the_cursor_names() -> None:
    """Two members the module has, the model a little surer of the other: the one sharing the
    enclosing function's word ranks first (rank.py's context_affinity_weight)."""
    members = (ModuleMembers("nodes", ("Compare", "Concat")),)
    prefix, suffix = "from pkg import nodes\n\n\ndef parse_concat(args):\n    return nodes.", "\n"
    candidates = [Completion("Compare(args)", logprob=-1.0, n_tokens=4, finish_reason="stop"), Completion("Concat(args)", logprob=-1.6, n_tokens=4, finish_reason="stop")]
    shown = postprocess(prefix, suffix, "python", candidates, members=member_names(prefix, members))
    assert [c.text for c in shown] == ["Concat(args)", "Compare(args)"]
    plain = postprocess(prefix.replace("parse_concat", "parse"), suffix, "python", candidates, members=member_names(prefix.replace("parse_concat", "parse"), members))
    assert [c.text for c in plain] == ["Compare(args)", "Concat(args)"]
