"""A local chat-completions server for CI: answers with recorded replies, in order.

Usage: python3 chat_server.py REPLIES.jsonl STATE_DIR

REPLIES.jsonl holds {"reply": "..."} lines (the replay planner's format). The
server binds 127.0.0.1 on a free port, writes the port to STATE_DIR/port, and
each request body to STATE_DIR/requests/NNN.json, so CI can check what the
LLM planner sent. Once the replies run out it answers with a reply that holds
no kernel. It stops by itself after 20 minutes (CI must never leave it behind).
Standard library only: it runs in whatever Python CI has.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LIFETIME_S = 20 * 60


def main() -> int:
    replies = [json.loads(line)["reply"] for line in Path(sys.argv[1]).read_text().splitlines() if line.strip()]
    state = Path(sys.argv[2])
    (state / "requests").mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    served = [0]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": "ci", "object": "model", "owned_by": "ci"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            with lock:
                k = served[0]
                served[0] += 1
                (state / "requests" / f"{k:03d}.json").write_bytes(body)
            text = replies[k] if k < len(replies) else "IDEA: nothing more to try.\n\nNo change."
            self._send(200, {
                "id": f"ci-{k}", "object": "chat.completion", "created": int(time.time()), "model": "ci",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": len(body) // 4, "completion_tokens": len(text) // 4,
                          "total_tokens": (len(body) + len(text)) // 4},
            })

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    (state / "port").write_text(str(httpd.server_address[1]))
    stopper = threading.Timer(LIFETIME_S, httpd.shutdown)
    stopper.daemon = True
    stopper.start()
    httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
