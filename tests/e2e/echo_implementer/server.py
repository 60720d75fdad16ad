"""A stand-in implementer in another image: the standard library only, speaking the /implement contract.

It answers every suggestion with the current kernel renamed to `ModelNew`, so a compose stack that uses it trains
end to end, and its log shows which requests reached it.
"""

import json
import os
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = os.environ.get("IMPLEMENTER_TOKEN", "")


class Handler(BaseHTTPRequestHandler):
    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._reply(
                200, {"status": "ok", "service": "implementer", "version": "echo", "details": {"backend": "echo"}}
            )
        else:
            self._reply(404, {"detail": "not found"})

    def do_POST(self) -> None:
        if self.path != "/implement":
            return self._reply(404, {"detail": "not found"})
        if TOKEN and self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._reply(401, {"detail": "missing or wrong bearer token"})
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        source = re.sub(r"\bclass Model\b", "class ModelNew", request["current_source"])
        self._reply(
            200,
            {
                "status": "ok",
                "source": source,
                "backend": "echo",
                "model": "echo",
                "message": "echo implementer: returned the current kernel",
            },
        )


if __name__ == "__main__":
    ThreadingHTTPServer(("0.0.0.0", 8002), Handler).serve_forever()
