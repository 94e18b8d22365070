"""The tools people already run, pointed at a real `kspec engine --listen` process (small
random model): llama.vim / llama.vscode's /infill requests as they send them, the answers
as they read them, n_cmpl alternatives decoded together; a Prometheus scrape of /metrics;
the same token rule as the other routes."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from llama_clients import llama_vim_info, llama_vim_lines, llama_vscode_lines
from test_engine_network import TOKEN, Served, _http, _http_raw, _start_engine, _stop, _wait_ready

from kspec.engine.serve.infill_api import cut_at_indent, parse_infill


@pytest.fixture(scope="module")
def engine(model_dir: Path, tmp_path_factory) -> Iterator[Served]:
    served = _start_engine(model_dir, tmp_path_factory.mktemp("infill"))
    _wait_ready(served)
    yield served
    _stop(served)


VIM_REQUEST = {  # llama.vim's FIM request, as s:fim_try_hint builds it
    "id_slot": 0, "input_prefix": "def add(a, b):\n", "input_suffix": "\n\nprint(add(1, 2))\n",
    "input_extra": [{"text": "def sub(a, b):\n    return a - b\n", "time": 3.0, "filename": "ops.py"}],
    "prompt": "    return", "n_predict": 12, "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.90,
    "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True, "t_max_prompt_ms": 30000,
    "t_max_predict_ms": 30000, "response_fields": ["content", "timings/prompt_n", "timings/predicted_n", "truncated", "tokens_cached"],
    "kspec": {"postprocess": False},
}  # fmt: skip


def test_llama_vim_request(engine: Served, random_engine) -> None:
    status, reply = _http(engine, "POST", "/infill", VIM_REQUEST)
    assert status == 200, reply
    assert set(reply) == set(VIM_REQUEST["response_fields"])
    expected = random_engine.complete(parse_infill(VIM_REQUEST).request).completions[0].text
    assert reply["content"] == cut_at_indent(expected, 4)[0]
    assert reply["timings/prompt_n"] > 0 and reply["truncated"] is False


def test_llama_vscode_request_with_n_cmpl(engine: Served, random_engine) -> None:
    body = {  # llama.vscode's createRequestPayload, plus n_cmpl for several alternatives
        "input_prefix": "for item in items:\n", "input_suffix": "\n", "input_extra": [], "prompt": "    print(", "n_predict": 10,
        "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
        "t_max_prompt_ms": 30000, "t_max_predict_ms": 30000, "n_cmpl": 3, "kspec": {"postprocess": False},
    }  # fmt: skip
    status, reply = _http(engine, "POST", "/infill", body)
    assert status == 200, reply
    expected = [c.text for c in random_engine.complete(parse_infill(body).request).completions]
    assert isinstance(reply, list) and [a["index"] for a in reply] == list(range(len(expected))) and len(expected) == 3
    assert [a["content"] for a in reply] == expected
    assert all({"content", "timings", "tokens_cached", "truncated", "generation_settings"} <= set(a) for a in reply)


def test_warm_up_completion_route_and_refusals(engine: Served) -> None:
    warm = {"input_prefix": "", "input_suffix": "", "input_extra": [{"text": "x = 1\n", "filename": "a.py"}], "prompt": "", "n_predict": 0, "response_fields": [""]}
    assert _http(engine, "POST", "/infill", warm) == (200, {})
    status, reply = _http(engine, "POST", "/completion", {"prompt": "import os\npath = os.", "n_predict": 6, "kspec": {"postprocess": False}})
    assert status == 200 and isinstance(reply["content"], str) and reply["tokens_predicted"] >= 1
    assert _http(engine, "POST", "/infill", {**VIM_REQUEST, "stream": True})[0] == 400
    assert _http(engine, "POST", "/infill", VIM_REQUEST, token=None)[0] == 401
    assert _http(engine, "POST", "/infill", VIM_REQUEST, token="guess")[0] == 401
    assert _http(engine, "GET", "/infill")[0] == 405


def _scrape(engine: Served, token: str | None = TOKEN) -> tuple[int, str, str]:
    connection = http.client.HTTPConnection(engine.host, engine.port, timeout=60)
    try:
        connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
        response = connection.getresponse()
        return response.status, response.getheader("content-type") or "", response.read().decode()
    finally:
        connection.close()


def _sample(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert match, f"no {name} in\n{text}"
    return float(match.group(1))


def test_metrics_after_requests(engine: Served) -> None:
    before = _sample(_scrape(engine)[2], 'kspec_requests_total{surface="http"}')
    body = {"prompt": "def add(a, b):\n    return", "n": 2, "max_tokens": 4, "temperature": 0}
    assert _http(engine, "POST", "/v1/completions", body)[0] == 200
    status, content_type, text = _scrape(engine)
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    assert _sample(text, 'kspec_requests_total{surface="http"}') == before + 1
    assert _sample(text, 'kspec_request_latency_seconds_count{surface="http"}') >= 1
    assert _sample(text, 'kspec_time_to_first_token_seconds_count{surface="http"}') >= 1
    assert _sample(text, "kspec_prompt_tokens_total") > 0
    assert _sample(text, 'kspec_branches_per_request_bucket{le="2.0"}') >= 1
    for name in ("kspec_requests_in_flight", "kspec_queue_length", "kspec_requests_per_batch_count", "kspec_accepted_draft_tokens_per_round_count", "kspec_prompt_tokens_reused_total"):
        _sample(text, name)
    assert _scrape(engine, token=None)[0] == 401 and _scrape(engine, token="guess")[0] == 401


VIM_FIELDS = [  # what llama.vim asks for in response_fields
    "content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms", "timings/prompt_per_second",
    "timings/predicted_n", "timings/predicted_ms", "timings/predicted_per_token_ms", "timings/predicted_per_second",
    "truncated", "tokens_cached",
]  # fmt: skip


def test_llama_vim_shows_kspecs_answer(engine: Served) -> None:
    """llama.vim's own acceptance check on the bytes kspec writes: compact JSON, or no ghost text ever.
    (The answer is the served engine's own: another engine in this process, its prefix cache
    holding other prompts, may round differently, and the random model's near-ties then flip.)"""
    body = {**VIM_REQUEST, "response_fields": VIM_FIELDS}
    status, raw = _http_raw(engine, "POST", "/infill", body)
    assert status == 200, raw
    expected = json.loads(raw)["content"]
    assert expected.strip() and expected == cut_at_indent(expected, 4)[0], "nothing to show, or not cut at llama.vim's indent"
    lines = llama_vim_lines(raw)
    assert lines is not None, raw[:200]
    assert "\n".join(lines) == expected.rstrip("\n") and llama_vim_info(raw)


def test_llama_vscode_reads_kspecs_answer_in_llama_cpps_field_order(engine: Served) -> None:
    body = {  # llama.vscode's createRequestPayload, as it sends it
        "input_prefix": "for item in items:\n", "input_suffix": "\n", "input_extra": [], "prompt": "    print(", "n_predict": 10,
        "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
        "t_max_prompt_ms": 30000, "t_max_predict_ms": 30000, "n_indent": 4, "kspec": {"postprocess": False},
    }  # fmt: skip
    status, raw = _http_raw(engine, "POST", "/infill", body)
    assert status == 200 and llama_vscode_lines(raw) is not None, raw[:200]
    assert llama_vim_lines(raw) is not None  # the same answer passes llama.vim's check
    keys = list(json.loads(raw))
    llama_cpp_order = ["index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted", "tokens_evaluated",
                       "generation_settings", "has_new_line", "truncated", "stop_type", "stopping_word", "tokens_cached", "timings"]  # fmt: skip
    assert keys == llama_cpp_order
    status, warm = _http_raw(engine, "POST", "/infill", {**body, "n_predict": 0, "samplers": [], "t_max_predict_ms": 1})
    assert status == 200 and not llama_vim_lines(warm)  # its warm-up answer shows nothing
