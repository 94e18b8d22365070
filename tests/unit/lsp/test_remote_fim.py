"""The `openai` backend against stand-ins that answer as vLLM and SGLang do: vLLM refuses
`suffix` with a 400 (vllm-project/vllm#9976), SGLang ignores it; remoteFim "auto" sends
the model family's template, falls back to the prefix alone once a server refuses
`suffix` (and remembers it), and refusals that would repeat on every keystroke reach the
status with what to set."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from vllm_standin import VllmLike

from kspec.engine.api import CompletionRequest
from kspec.engine.errors import InputError
from kspec.engine.serve.network import parse_engine_url
from kspec.engine.serve.status import ERROR, READY, Status
from kspec.lsp_server import fim
from kspec.lsp_server.remote_backend import OpenAIEngine, RemoteOptions
from kspec.lsp_server.settings import parse_settings

QWEN_TEMPLATE = "<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"


@pytest.fixture
def serve() -> Iterator[Any]:
    started: list[VllmLike] = []

    def start(*args: Any, **kwargs: Any) -> VllmLike:
        started.append(VllmLike(*args, **kwargs))
        return started[-1]

    yield start
    for server in started:
        server.close()


REQUEST = CompletionRequest(prefix="def f():\n    ", suffix="\n\nprint(f())\n", path="/w/a.py", k=2, max_tokens=8, raw=True)


async def connect(server: VllmLike, setting: str = fim.AUTO, api_key: str | None = None) -> tuple[OpenAIEngine, list[Status]]:
    statuses: list[Status] = []
    engine = OpenAIEngine(RemoteOptions(parse_engine_url(server.url), None, api_key, fim=setting), statuses.append)
    await engine.start()
    return engine, statuses


def test_auto_is_the_default_setting() -> None:
    assert parse_settings({}).settings.remote_fim == fim.AUTO
    assert parse_settings({"remoteFim": "suffix"}).settings.remote_fim == "suffix"
    assert parse_settings({"remoteFim": "<bad>"}).problems


@pytest.mark.parametrize(
    "names, template",
    [
        (("Qwen/Qwen2.5-Coder-7B",), QWEN_TEMPLATE),
        (("qwen3-coder-30b-a3b",), QWEN_TEMPLATE),
        (("team-model", "/models/bigcode/starcoder2-3b"), "<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>"),
        (("deepseek-ai/deepseek-coder-6.7b-base",), "<｜fim▁begin｜>{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>"),
        (("codellama/CodeLlama-7b-hf",), "<PRE> {prefix} <SUF>{suffix} <MID>"),
        (("mistralai/Codestral-22B-v0.1",), "[SUFFIX]{suffix}[PREFIX]{prefix}"),
        (("meta-llama/Llama-3.1-8B",), None),
    ],
)
def test_families_by_name(names: tuple[str, ...], template: str | None) -> None:
    assert fim.template_for(*names) == template


async def test_vllm_with_a_known_family_gets_its_template_not_suffix(serve) -> None:
    server = serve("Qwen/Qwen2.5-Coder-1.5B")
    engine, statuses = await connect(server)
    assert statuses[-1].state == READY
    result = await engine.complete(REQUEST)
    assert [c.text for c in result.completions] == ["x0 = 0", "x1 = 1"]
    (body,) = server.bodies
    assert "suffix" not in body
    assert body["prompt"] == QWEN_TEMPLATE.replace("{prefix}", REQUEST.prefix).replace("{suffix}", REQUEST.suffix)


async def test_vllm_served_name_hides_the_family_but_root_shows_it(serve) -> None:
    server = serve("team-coder", root="/models/starcoder2-7b")
    engine, _ = await connect(server)
    await engine.complete(REQUEST)
    assert server.bodies[0]["prompt"].startswith("<fim_prefix>def f():")


async def test_vllm_refusing_suffix_for_an_unknown_family_falls_back_once_and_remembers(serve) -> None:
    server = serve("team-model")
    engine, statuses = await connect(server)
    result = await engine.complete(REQUEST)
    assert [c.text for c in result.completions] == ["x0 = 0", "x1 = 1"]  # the keystroke still gets an answer
    assert [("suffix" in b) for b in server.bodies] == [True, False]
    assert server.bodies[1]["prompt"] == REQUEST.prefix
    assert statuses[-1].state == READY and "remoteFim" in statuses[-1].message
    await engine.complete(REQUEST)
    assert len(server.bodies) == 3 and "suffix" not in server.bodies[2]  # remembered: no second refusal


async def test_explicit_suffix_refused_is_an_error_saying_what_to_set(serve) -> None:
    server = serve("Qwen/Qwen2.5-Coder-1.5B")
    engine, statuses = await connect(server, "suffix")
    with pytest.raises(InputError, match="remoteFim"):
        await engine.complete(REQUEST)
    assert statuses[-1].state == ERROR and "remoteFim" in statuses[-1].message and "suffix is not currently supported" in statuses[-1].message


async def test_an_explicit_template_wins_over_the_family(serve) -> None:
    server = serve("Qwen/Qwen2.5-Coder-1.5B")
    engine, _ = await connect(server, "<A>{prefix}<B>{suffix}<C>")
    await engine.complete(REQUEST)
    assert server.bodies[0]["prompt"] == f"<A>{REQUEST.prefix}<B>{REQUEST.suffix}<C>"


async def test_kspec_engine_gets_the_suffix_field(serve) -> None:
    server = serve("Qwen/Qwen2.5-Coder-1.5B", owned_by="kspec")
    engine, _ = await connect(server)
    await engine.complete(REQUEST)
    assert server.bodies[0]["prompt"] == REQUEST.prefix and server.bodies[0]["suffix"] == REQUEST.suffix


async def test_a_refused_api_key_is_an_error_status_saying_what_to_set(serve) -> None:
    server = serve("team-model", api_key="right")
    _, statuses = await connect(server, api_key="wrong")
    assert statuses[-1].state == ERROR and "401" in statuses[-1].message
    server_ok = serve("team-model", api_key="right")
    engine, statuses = await connect(server_ok, api_key="right")
    engine.options = RemoteOptions(parse_engine_url(server_ok.url), None, "wrong")  # the key changed on the server's side
    with pytest.raises(Exception):
        await engine.complete(REQUEST)
    assert statuses[-1].state == ERROR and "engineTokenFile" in statuses[-1].message


async def test_sglang_which_ignores_suffix_gets_the_template(serve) -> None:
    server = serve("Qwen/Qwen2.5-Coder-7B-Instruct", owned_by="sglang")
    engine, _ = await connect(server)
    await engine.complete(REQUEST)
    assert "suffix" not in server.bodies[0] and server.bodies[0]["prompt"].startswith("<|fim_prefix|>")


async def test_other_files_context_goes_before_the_prefix_as_path_comments(serve) -> None:
    """An OpenAI-compatible server gets the request's context too: each piece under a comment with
    its path, then a comment naming the cursor's file, before the text before the cursor (inside
    the model's template), so the server's own prefix cache keeps that stable start."""
    from dataclasses import replace

    from kspec.engine.api import ContextFile

    server = serve("Qwen/Qwen2.5-Coder-1.5B")
    engine, _ = await connect(server)
    pieces = (ContextFile("pkg/util.py", "def helper(x):\n    ..."), ContextFile("pkg/const.py", "LIMIT = 3\n"))
    await engine.complete(replace(REQUEST, path="/w/pkg/a.py", language="python", context=pieces))
    block = "# pkg/util.py\ndef helper(x):\n    ...\n\n# pkg/const.py\nLIMIT = 3\n\n# pkg/a.py\n"
    assert server.bodies[0]["prompt"] == QWEN_TEMPLATE.format(prefix=block + REQUEST.prefix, suffix=REQUEST.suffix)
    await engine.complete(REQUEST)  # no context: the prompt is as before
    assert server.bodies[1]["prompt"] == QWEN_TEMPLATE.format(prefix=REQUEST.prefix, suffix=REQUEST.suffix)
