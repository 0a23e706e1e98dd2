"""An in-memory stand-in for the server's worker endpoints (docs/worker-protocol.md).

For tests and benchmarks of the worker without the real server: queued items go out on claim,
results are stored once (duplicates reported as such), and 503s can be injected per endpoint.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class StubServer:
    """Queued items go out on claim; results are stored once; faults are injected per path."""

    def __init__(self, token: str = "secret", heartbeat_s: float = 0.2) -> None:
        self.token = token
        self.heartbeat_s = heartbeat_s
        self.lock = threading.Lock()
        self.queue: list[dict[str, Any]] = []
        self.leased: dict[Any, dict[str, Any]] = {}
        self.results: dict[Any, dict[str, Any]] = {}
        self.reports = 0
        self.heartbeats: list[list[Any]] = []
        self.released: list[Any] = []
        self.registered: list[dict[str, Any]] = []
        #: endpoint name -> how many of the next calls answer 503
        self.fail: dict[str, int] = {}
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"

    def handle(self, endpoint: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if self.fail.get(endpoint, 0) > 0:
                self.fail[endpoint] -= 1
                return 503, {"detail": "injected"}
            return 200, getattr(self, f"_{endpoint}")(body)

    def _register(self, body: dict[str, Any]) -> dict[str, Any]:
        self.registered.append(body)
        return {"worker_id": f"w{len(self.registered)}", "lease_s": 30,
                "heartbeat_s": self.heartbeat_s}

    def _claim(self, body: dict[str, Any]) -> dict[str, Any]:
        items, self.queue = self.queue[: body["max_items"]], self.queue[body["max_items"]:]
        self.leased.update({i["measure_id"]: i for i in items})
        return {"items": items}

    def _heartbeat(self, body: dict[str, Any]) -> dict[str, Any]:
        self.heartbeats.append(body["measure_ids"])
        return {"extended": body["measure_ids"], "lost": []}

    def _results(self, body: dict[str, Any]) -> dict[str, Any]:
        self.reports += 1
        accepted: list[Any] = []
        duplicates: list[Any] = []
        for result in body["results"]:
            mid = result["measure_id"]
            (duplicates if mid in self.results else accepted).append(mid)
            self.results.setdefault(mid, result)
            self.leased.pop(mid, None)
        return {"accepted": accepted, "duplicates": duplicates, "rejected": []}

    def _release(self, body: dict[str, Any]) -> dict[str, Any]:
        released = [i for i in body["measure_ids"] if i in self.leased]
        for mid in released:
            self.queue.append(self.leased.pop(mid))
        self.released += released
        return {"released": released}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.headers.get("Authorization") != f"Bearer {stub.token}":
                    status, answer = 401, {"detail": "bad token"}
                else:
                    status, answer = stub.handle(self.path.rstrip("/").rsplit("/", 1)[-1], body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        return Handler

    def __enter__(self) -> StubServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
