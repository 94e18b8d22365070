"""A stand-in for an OpenAI-compatible server that answers as vLLM does (imported by the
tests as `vllm_standin`): `/v1/models` entries with owned_by "vllm" and `root` (the model
path), and a `suffix` in `/v1/completions` refused with vLLM's 400 body
("suffix is not currently supported", vllm-project/vllm#9976). owned_by "sglang" takes
`suffix` and ignores it, as SGLang does; owned_by "kspec" takes it as kspec does."""

from __future__ import annotations

import threading
from typing import Any

from loopback_http import JsonHandler, LoopbackServer


class VllmLike(LoopbackServer):
    """/v1/models and /v1/completions as vLLM answers them (owned_by "vllm", `root` = the
    model path; a body with `suffix` -> 400 with vLLM's error body)."""

    def __init__(self, model: str, root: str = "", owned_by: str = "vllm", api_key: str | None = None) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, int]] = []  # (method, path as sent, the client's port: one per connection)
        self.gate: threading.Event | None = None  # when set to an Event, a POST waits for it before answering
        self.post_arrived = threading.Event()
        stand_in = self

        class Handler(JsonHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn
            disable_nagle_algorithm = True  # TCP_NODELAY, as uvicorn: no delayed-ACK stall between headers and body

            def parse_request(self) -> bool:
                ok = super().parse_request()
                if ok:
                    stand_in.requests.append((self.command, self.path, self.client_address[1]))
                return ok

            def _authorized(self) -> bool:
                if api_key is None or self.headers.get("Authorization") == f"Bearer {api_key}":
                    return True
                self.answer_json({"error": "Unauthorized"}, status=401)
                return False

            def do_GET(self) -> None:
                if self._authorized():
                    entry = {"id": model, "object": "model", "created": 0, "owned_by": owned_by, "root": root or model, "parent": None}
                    self.answer_json({"object": "list", "data": [entry]})

            def do_POST(self) -> None:
                body = self.read_json()
                stand_in.bodies.append(body)
                stand_in.post_arrived.set()
                if stand_in.gate is not None:
                    stand_in.gate.wait(60)
                if not self._authorized():
                    return
                if body.get("suffix") is not None and owned_by == "vllm":
                    error = {"message": "suffix is not currently supported", "type": "BadRequestError", "param": None, "code": 400}
                    self.answer_json({"error": error}, status=400)
                    return
                choices = [{"index": i, "text": f"x{i} = {i}", "finish_reason": "length", "logprobs": None} for i in range(body.get("n", 1))]
                self.answer_json({"id": "cmpl-1", "object": "text_completion", "model": model, "choices": choices})

        super().__init__(Handler)
