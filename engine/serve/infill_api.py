"""llama.cpp's `/infill` and `/completion`, as plain data, for the editors that speak them
(llama.vscode, llama.vim): point their endpoint at a kspec network engine.

`POST /infill` fields read: input_prefix, input_suffix, prompt (the part of the cursor's
line before it, appended to input_prefix as llama.cpp does), input_extra (chunks of other
files, `[{"text", "filename"}]`: the request's `context`, laid out before the file's text with
their file names as the language server's context is, engine/context_prompt.py), n_predict (-1: the default,
0: nothing is generated: llama.vscode/llama.vim warm the cache with it), n_indent (a
line indented less ends the completion), n_cmpl (-> k alternatives decoded together over
the shared prefix), t_max_prompt_ms + t_max_predict_ms (-> the deadline: kspec answers
with what is complete by then), stop, temperature (default 0: the k most likely distinct
alternatives), top_p, seed, response_fields ("timings/prompt_n" style paths, flattened as
llama.cpp does). Accepted and ignored: cache_prompt (kspec always reuses the previous
keystroke's prefix), id_slot, model (the one served answers), top_k, samplers,
t_max_prompt_ms alone, lora. `stream` is
refused. kspec's cursor rules and tree-sitter trimming apply unless
`"kspec": {"postprocess": false}`.

`POST /completion` takes `prompt` (and optionally the same fields) and continues it.

The answer is llama.cpp's object (content, stop_type, tokens_predicted, tokens_cached,
timings, ...); with n_cmpl > 1 it is a JSON array of such objects, one per alternative,
each with its `index`, as llama.cpp answers several completions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kspec.engine.api import MAX_K, MAX_NEW_TOKENS, CompletionRequest, CompletionResult, ContextFile, mode_for_temperature
from kspec.engine.errors import InputError
from kspec.engine.serve.openai_api import DEFAULT_DEADLINE_MS, ApiError, _integer, _number, _stops, _text

DEFAULT_N_PREDICT = 128  # n_predict -1 ("until done"), capped by the engine's per-request limit
MAX_EXTRA_CHUNKS = 64


@dataclass(frozen=True)
class ParsedInfill:
    request: CompletionRequest
    n_indent: int  # 0: no indentation rule
    response_fields: tuple[str, ...]  # empty: every field
    generate: bool  # False for n_predict 0 (a cache warm-up): answer at once
    prompt_chars: int  # what the engine was given, for `prompt` in the answer


def _extra(body: dict[str, Any]) -> tuple[ContextFile, ...]:
    chunks = body.get("input_extra") or []
    if not isinstance(chunks, list) or len(chunks) > MAX_EXTRA_CHUNKS:
        raise ApiError.invalid(f"'input_extra' must be a list of up to {MAX_EXTRA_CHUNKS} {{text, filename}} objects", "input_extra")
    parts = []
    for chunk in chunks:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text", ""), str) or not isinstance(chunk.get("filename", ""), str):
            raise ApiError.invalid("each 'input_extra' chunk must be an object with string 'text' (and 'filename')", "input_extra")
        if chunk.get("text"):
            parts.append(ContextFile(chunk.get("filename", "") or "extra", chunk["text"]))
    try:
        return ContextFile.parse_all(parts)
    except InputError as exc:
        raise ApiError.invalid(str(exc), "input_extra") from exc


def _response_fields(body: dict[str, Any]) -> tuple[str, ...]:
    fields = body.get("response_fields") or []
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise ApiError.invalid("'response_fields' must be a list of strings", "response_fields")
    return tuple(fields)


def parse_infill(body: Any, infill: bool = True) -> ParsedInfill:
    """A `/infill` (or, with infill=False, `/completion`) JSON body -> the engine request (raises ApiError)."""
    if not isinstance(body, dict):
        raise ApiError.invalid("the request body must be a JSON object")
    if body.get("stream"):
        raise ApiError.invalid("'stream' is not supported by this server", "stream")
    if infill:
        context = _extra(body)
        prefix = _text(body, "input_prefix") + _text(body, "prompt")
        suffix = _text(body, "input_suffix")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ApiError.invalid("'prompt' must be a string", "prompt")
        prefix, suffix, context = prompt, "", ()
    n_predict = _integer(body, "n_predict", -1, -1, 1 << 30)
    temperature = _number(body, "temperature", 0.0, 0.0, 2.0)
    deadline_ms = DEFAULT_DEADLINE_MS
    if body.get("t_max_predict_ms") is not None:
        predict_ms = _number(body, "t_max_predict_ms", 0.0, 0.0, 600000.0)
        prompt_ms = _number(body, "t_max_prompt_ms", 0.0, 0.0, 600000.0)
        deadline_ms = max(1.0, prompt_ms + predict_ms)
    extensions = body.get("kspec") or {}
    if not isinstance(extensions, dict) or not isinstance(extensions.get("postprocess", True), bool):
        raise ApiError.invalid("'kspec' must be an object whose 'postprocess' is true or false", "kspec")
    postprocess = bool(extensions.get("postprocess", True))
    request = CompletionRequest(
        prefix=prefix,
        suffix=suffix,
        language=_text(extensions, "language"),
        path=_text(extensions, "path"),
        k=_integer(body, "n_cmpl", 1, 1, MAX_K),
        max_tokens=min(MAX_NEW_TOKENS, DEFAULT_N_PREDICT if n_predict < 0 else max(1, n_predict)),
        mode=mode_for_temperature(temperature),
        temperature=temperature,
        top_p=_number(body, "top_p", 1.0, 1e-6, 1.0) or 1.0,
        seed=max(0, _integer(body, "seed", 0, -1, 2**63 - 1)),  # llama.cpp's -1: any seed
        deadline_ms=deadline_ms,
        raw=not postprocess,
        stop=_stops(body),
        cursor_rules=postprocess,
        context=context,
    )
    return ParsedInfill(
        request, _integer(body, "n_indent", 0, 0, 1000), _response_fields(body), n_predict != 0,
        len(prefix) + sum(len(piece.text) for piece in context),
    )


def cut_at_indent(text: str, n_indent: int) -> tuple[str, bool]:
    """llama.cpp's n_indent: the text up to the first later line that is indented less
    than `n_indent` (blank lines do not count) -> (text, cut)."""
    if n_indent <= 0:
        return text, False
    lines = text.split("\n")
    for at, line in enumerate(lines[1:], 1):
        if line.strip() and len(line) - len(line.lstrip(" \t")) < n_indent:
            return "\n".join(lines[:at]) + "\n", True
    return text, False


def infill_response(result: CompletionResult | None, parsed: ParsedInfill) -> Any:
    """llama.cpp's answer object, or a list of them (one per alternative) when n_cmpl > 1."""
    timing = result.timing_ms if result is not None else {}
    completions = result.completions if result is not None else []
    texts = [cut_at_indent(c.text, parsed.n_indent) for c in completions] or [("", False)]
    prompt_n = int(timing.get("prompt_tokens", 0))
    cached = int(timing.get("reused_prompt_tokens", 0))
    prompt_ms, predicted_ms = float(timing.get("prefill", 0.0)), float(timing.get("decode", 0.0))
    answers = []
    for index, (text, indented) in enumerate(texts):
        completion = completions[index] if index < len(completions) else None
        n = completion.n_tokens if completion is not None else 0
        reason = completion.finish_reason if completion is not None else ""
        # the fields in the order llama.cpp's server writes them (its to_json_non_oaicompat);
        # not its "prompt", which would send the whole window back with every answer
        answer = {
            "index": index,
            "content": text,
            "tokens": [],  # llama.cpp: token ids only when return_tokens is asked for
            "id_slot": 0,
            "stop": True,
            "model": result.model if result is not None else "",
            "tokens_predicted": n,
            "tokens_evaluated": prompt_n,
            "generation_settings": {
                "n_predict": parsed.request.max_tokens if parsed.generate else 0,
                "temperature": parsed.request.temperature,
                "top_p": parsed.request.top_p,
                "seed": parsed.request.seed,
                "n_cmpl": parsed.request.k,
                "n_indent": parsed.n_indent,
                "stop": list(parsed.request.stop),
            },
            "has_new_line": "\n" in text,
            "truncated": False,
            "stop_type": "eos" if reason in ("eos", "stop") or indented else "limit",
            "stopping_word": "",
            "tokens_cached": cached + n,
            "timings": {
                "prompt_n": prompt_n - cached,
                "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / max(1, prompt_n - cached),
                "prompt_per_second": 1000.0 * (prompt_n - cached) / prompt_ms if prompt_ms > 0 else 0.0,
                "predicted_n": n,
                "predicted_ms": predicted_ms,
                "predicted_per_token_ms": predicted_ms / max(1, n),
                "predicted_per_second": 1000.0 * n / predicted_ms if predicted_ms > 0 else 0.0,
            },
        }
        answers.append(select_fields(answer, parsed.response_fields))
    return answers[0] if parsed.request.k == 1 else answers


def select_fields(answer: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """llama.cpp's response_fields: only these, a nested one ("timings/prompt_n") under its
    path as the key; a field that does not exist is left out."""
    if not fields:
        return answer
    selected: dict[str, Any] = {}
    for path in fields:
        value: Any = answer
        for part in path.split("/"):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            selected[path] = value
    return selected
