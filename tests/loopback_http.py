"""What the tests' fake OpenAI-compatible servers share: a handler that answers JSON and
reads a JSON body, and a threaded server on a free loopback port with its /v1 base URL."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def answer_json(self, body: Any, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read_json(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))


class LoopbackServer:
    """`handler` served on 127.0.0.1 (a free port) by a daemon thread until `close()`."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
