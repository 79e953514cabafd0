"""A local HTTP server speaking the OpenAI chat-completions protocol, scripted by the tests.

POST {base}/chat/completions answers from a script of (status, body, delay) entries;
GET {base}/models answers ``models_status`` with a one-model listing.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional


def completion(content: Optional[str], prompt_tokens: int = 1000, completion_tokens: int = 500,
               choices: bool = True) -> dict:
    return {
        "id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()), "model": "fake-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop"}] if choices else [],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


MODELS = {"object": "list", "data": [{"id": "fake-model", "object": "model", "created": 0, "owned_by": "test"}]}


class FakeOpenAI:
    """Answers POST /v1/chat/completions from a script; ``always`` answers every request once it runs out."""

    def __init__(self) -> None:
        self.script: list[dict[str, Any]] = []
        self.always: Optional[dict[str, Any]] = None
        self.requests: list[dict[str, Any]] = []  # chat requests, in order
        self.gets: list[str] = []  # paths of GET requests
        self.models_status = 200
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def _send(self, status: int, payload: bytes, content_type: str = "application/json") -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            def do_GET(self) -> None:
                fake.gets.append(self.path)
                ok = self.path.rstrip("/").endswith("/models") and fake.models_status == 200
                body = MODELS if ok else {"error": {"message": f"HTTP {fake.models_status}"}}
                self._send(fake.models_status if self.path.rstrip("/").endswith("/models") else 404,
                           json.dumps(body).encode())

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fake.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                      "json": json.loads(body)})
                entry = fake.script.pop(0) if fake.script else fake.always or {
                    "status": 418, "body": {"error": "script empty"}}
                time.sleep(entry.get("delay", 0.0))
                payload = entry.get("body", b"")
                payload = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self._send(entry.get("status", 200), payload, entry.get("content_type", "application/json"))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True  # a handler still sleeping must not block teardown
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def reply(self, content: Optional[str] = None, status: int = 200, delay: float = 0.0, **kw: Any) -> None:
        body = kw.pop("body", None)
        self.script.append({"status": status, "delay": delay,
                            "body": completion(content) if body is None else body, **kw})

    def user_prompt(self, k: int) -> str:
        return self.requests[k]["json"]["messages"][-1]["content"]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
