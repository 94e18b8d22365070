"""A branch inside `module.name` goes on only with the module's names (engine/decode/member_constraint.py):
monitor-guided decoding with the names the language server resolved."""

from __future__ import annotations

import re

import torch

from kspec.engine.api import ModuleMembers
from kspec.engine.decode.branches import Branch, BranchTracker, DecodeLimits
from kspec.engine.decode.drafters import PromptLookupDrafter
from kspec.engine.decode.member_constraint import MemberConstraint
from kspec.engine.decode.sampling import SamplingParams
from kspec.engine.decode.speculative import SpeculativeRun, pad_rows
from kspec.engine.decode.stopping import StopRule

NAMES = (ModuleMembers("nodes", ("Concat", "Const", "TemplateData", "_hidden")),)


def _constraint(engine, prefix: str) -> MemberConstraint:
    return MemberConstraint(engine.target.tokenizer, engine.target.model.args.vocab_size, torch.device("cpu"), prefix, NAMES)


def test_only_tokens_that_go_on_or_end_a_member_name_are_allowed(random_engine):
    tokenizer = random_engine.target.tokenizer
    texts = tokenizer.token_texts()
    constraint = _constraint(random_engine, "x = nodes.")
    bias = constraint.bias(Branch(text="Con"))
    assert bias is not None
    allowed = {texts[i] for i in torch.isfinite(bias).nonzero().flatten().tolist()}
    assert {"c", "s", "st"} <= allowed and "x" not in allowed and " c" not in allowed
    assert all("cat".startswith(t) or "st".startswith(t) or re.match(r"(cat|st)[^\w$]", t) for t in allowed)
    # a whole name: it may end (any token not going on a name) or go on to a longer one
    whole = constraint.bias(Branch(text="Const"))
    assert whole is not None and bool(torch.isfinite(whole[tokenizer.encode("(")[0]]))
    assert constraint.bias(Branch(text="Concat(")) is None  # past the name: free again
    assert constraint.bias(Branch(text="Zz")) is None  # no member starts so: nothing to keep it to
    healing = constraint.bias(Branch(text="", heal_remaining="."))  # still regenerating the `.`: it comes first
    assert healing is not None
    healed = {texts[i] for i in torch.isfinite(healing).nonzero().flatten().tolist()}
    assert "." in healed and all(t == "." or re.match(r"\.(C|Co|Con|Conc|Conca|Concat|Cons|Const|T\w*)($|[^\w$])", t) for t in healed), healed
    assert _constraint(random_engine, "x = 1\n").bias(Branch(text="y = nodes.T")) is not None  # the branch wrote the qualifier


def test_a_random_model_after_the_qualifier_writes_only_member_names(random_engine):
    """The random model would write any token; kept to the names, every branch writes one of them
    whole, then goes on freely."""
    model, tokenizer = random_engine.target.model, random_engine.target.tokenizer
    prefix = "def f(args):\n    return nodes."
    tracker = BranchTracker(tokenizer, StopRule(), DecodeLimits(12, ignore_eos=True), tokenizer.encode(prefix))
    run = SpeculativeRun(
        model, tracker, 4, SamplingParams(), PromptLookupDrafter(), diverse=True, names=_constraint(random_engine, prefix)
    )  # fmt: skip
    with torch.inference_mode():
        while not run.finished():
            run.accept(model(pad_rows(run.propose(), model.device), run.cache), 1.0)
    written = [re.match(r"[\w$]*", branch.text).group(0) for branch in run.branches]  # type: ignore[union-attr]
    assert all(name in ("Concat", "Const", "TemplateData") for name in written), written
    assert all(len(branch.token_ids) == 12 for branch in run.branches)
