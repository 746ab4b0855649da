"""A worker's own HTTP port (``backburner worker --metrics-port``): ``/metrics`` for Prometheus
and ``/healthz`` for a liveness probe.

It is served from a thread, so that it answers whatever the event loop does; that is also why
``/healthz`` asks the loop rather than answering for it: the loop ticks every second, and a
loop that has not ticked for longer than a lease (a handler that blocks it: ``time.sleep``, a
CPU-bound call) is reported stalled with a 503. By then its jobs' leases have run out and
other workers have taken them over: restarting the process is the cure.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TICK_S = 1.0
"""How often the event loop tells the server it is alive."""


class OpsServer:
    """``/metrics`` (``render()``'s text) and ``/healthz`` on ``host:port``, from a thread."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        render: Callable[[], bytes],
        content_type: str,
        stall_s: float,
    ) -> None:
        # (A lease shorter than a few ticks would have a loop that just ticked look stalled.)
        self.stall_s = max(stall_s, 3 * TICK_S)
        self._ticked = time.monotonic()
        ops = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.partition("?")[0]
                if path == "/metrics":
                    self._answer(200, render(), content_type)
                elif path == "/healthz":
                    status, body = ops.health()
                    self._answer(status, json.dumps(body).encode(), "application/json")
                else:
                    error = {"type": "not_found", "message": "only /metrics and /healthz here"}
                    self._answer(404, json.dumps({"error": error}).encode(), "application/json")

            def _answer(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # (a scrape every few seconds is not news)

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        self._server = Server((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="backburner-ops", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def tick(self) -> None:
        """The event loop is alive (called from it, every TICK_S)."""
        self._ticked = time.monotonic()

    def health(self) -> tuple[int, dict[str, object]]:
        """(status, body) of /healthz."""
        silent = time.monotonic() - self._ticked
        if silent <= self.stall_s:
            return 200, {"status": "ok"}
        message = (
            f"the worker's event loop has not run for {silent:.0f} s (more than a lease,"
            f" {self.stall_s:g} s): something blocks it"
        )
        return 503, {"error": {"type": "event_loop_stalled", "message": message}}

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
