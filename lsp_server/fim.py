"""How the `openai` backend sends the text after the cursor (the `remoteFim` setting).

- "suffix": the completions API's `suffix` field (kspec's own engine and DeepSeek's API
  read it; vLLM answers 400 "suffix is not currently supported", SGLang ignores it).
- a template with {prefix} and {suffix}: the model's fill-in-the-middle prompt, written
  by this client.
- "auto" (the default): kspec's own engine gets `suffix`; a model whose family is known
  from its name (the served name or, on vLLM, the `root` path) gets its template; any
  other gets `suffix`, and when the server refuses that, the text before the cursor alone
  (remembered for that server, and said in the status).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SUFFIX_FIELD = "suffix"
AUTO = "auto"
PREFIX_ONLY = "prefix-only"  # resolved mode after a server refused `suffix` and no template is known

# Fill-in-the-middle templates by model family, matched on the lower-cased model name.
FAMILY_TEMPLATES: tuple[tuple[str, str, str], ...] = (
    ("qwen-coder", r"qwen[\d.]*-?coder|codeqwen", "<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"),
    ("codegemma", r"codegemma", "<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"),
    ("starcoder", r"starcoder|santacoder|stable-?code|refact", "<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>"),
    ("deepseek-coder", r"deepseek-?coder", "<｜fim▁begin｜>{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>"),
    ("codellama", r"code-?llama", "<PRE> {prefix} <SUF>{suffix} <MID>"),
    ("codestral", r"codestral", "[SUFFIX]{suffix}[PREFIX]{prefix}"),
)


def check_setting(value: str) -> str | None:
    """None when `value` is a valid remoteFim, else what is wrong."""
    if value in (AUTO, SUFFIX_FIELD) or ("{prefix}" in value and "{suffix}" in value):
        return None
    return "must be 'auto', 'suffix' or a template containing {prefix} and {suffix}"


def template_for(*names: str) -> str | None:
    """The FIM template of the first of these model names whose family is known."""
    for name in names:
        lowered = name.lower()
        for _family, pattern, template in FAMILY_TEMPLATES:
            if re.search(pattern, lowered):
                return template
    return None


def refuses_suffix(status: int, message: str) -> bool:
    """An error answer that names the `suffix` field: vLLM's 400 "suffix is not currently
    supported", or a gateway's "Unsupported param: suffix"."""
    return status >= 400 and "suffix" in message.lower()


@dataclass(frozen=True)
class FimMode:
    """What to send: the `suffix` field, a template, or the prefix alone."""

    kind: str  # SUFFIX_FIELD, "template" or PREFIX_ONLY
    template: str = ""

    def fields(self, prefix: str, suffix: str) -> dict[str, str]:
        """The request body's `prompt` (and `suffix`) for this cursor."""
        if self.kind == SUFFIX_FIELD:
            return {"prompt": prefix, "suffix": suffix}
        if self.kind == PREFIX_ONLY:
            return {"prompt": prefix}
        return {"prompt": self.template.replace("{prefix}", prefix).replace("{suffix}", suffix)}


def resolve(setting: str, model: str, root: str = "", owned_by: str = "") -> FimMode:
    """The mode for `setting` against a served model (its id, vLLM's `root`, `owned_by`)."""
    if setting == SUFFIX_FIELD:
        return FimMode(SUFFIX_FIELD)
    if setting != AUTO:
        return FimMode("template", setting)
    if owned_by == "kspec":
        return FimMode(SUFFIX_FIELD)  # kspec builds the model's own FIM prompt from tokens
    template = template_for(model, root)
    return FimMode("template", template) if template else FimMode(SUFFIX_FIELD)
