"""Real HTTP servers on 127.0.0.1 that stand in front of, or in place of, an OpenAI-compatible server in tests.

`ScriptedChat` answers chat completions with scripted texts (it stands in for GPT-4o, which cannot run here);
`RecordingProxy` forwards to a real server (llama.cpp) and keeps the request bodies; the others misbehave.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


class Recorder:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()

    def enter(self, body: dict[str, Any]) -> None:
        with self.lock:
            self.bodies.append(body)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1


def completion(text: str, prompt_tokens: int = 11, completion_tokens: int = 7) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "scripted",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


class _Handler(BaseHTTPRequestHandler):
    recorder: Recorder

    def log_message(self, *args: Any) -> None:  # keep pytest output clean
        return

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        self.recorder.enter(body)
        try:
            self.answer(body)
        finally:
            self.recorder.leave()

    def answer(self, body: dict[str, Any]) -> None:
        raise NotImplementedError


@contextlib.contextmanager
def serve(handler: type[_Handler], **attributes: Any) -> Iterator[tuple[str, Recorder]]:
    """Run `handler` on a free port; yields (base URL ending in /v1, recorder)."""
    recorder = Recorder()
    bound = type(handler.__name__, (handler,), {"recorder": recorder, **attributes})
    server = ThreadingHTTPServer(("127.0.0.1", 0), bound)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", recorder
    finally:
        server.shutdown()
        server.server_close()


class ScriptedChat(_Handler):
    """Answers the n-th request with replies[n] (the last one repeats); a reply may be an int HTTP status."""

    replies: list[str | int] = []
    delay_s: float = 0.0

    def answer(self, body: dict[str, Any]) -> None:
        time.sleep(self.delay_s)
        reply = self.replies[min(len(self.recorder.bodies), len(self.replies)) - 1]
        if isinstance(reply, int):
            self._send(reply, json.dumps({"error": {"message": f"scripted {reply}", "type": "server_error"}}).encode())
        else:
            self._send(200, json.dumps(completion(reply)).encode())


class AlwaysFails(_Handler):
    status: int = 500

    def answer(self, body: dict[str, Any]) -> None:
        self._send(self.status, json.dumps({"error": {"message": "internal failure", "type": "server_error"}}).encode())


class TooSlow(_Handler):
    delay_s: float = 5.0

    def answer(self, body: dict[str, Any]) -> None:
        time.sleep(self.delay_s)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._send(200, json.dumps(completion("too late")).encode())


class RecordingProxy(_Handler):
    """Forwards POSTs to `upstream` (e.g. llama.cpp's /v1) and records each request body."""

    upstream: str = ""

    def answer(self, body: dict[str, Any]) -> None:
        path = self.path.removeprefix("/v1")
        response = httpx.post(self.upstream + path, json=body, timeout=600.0)
        self._send(response.status_code, response.content, response.headers.get("content-type", "application/json"))
