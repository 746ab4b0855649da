"""A real uvicorn server on loopback, in a thread of the test process, for API tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from backburner import Backburner, Settings
from backburner.api import create_app


class LiveServer:
    def __init__(self, server: uvicorn.Server, thread: threading.Thread, settings: Settings):
        self.server = server
        self.thread = thread
        self.settings = settings

    @property
    def url(self) -> str:
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"


@contextmanager
def live_server(
    tmp_path: Path,
    *,
    run_worker: bool = True,
    backburner: Backburner | None = None,
    **settings: Any,
) -> Iterator[LiveServer]:
    """Serve the API (and a worker, by default) on 127.0.0.1 and a free port until exit."""
    base = {
        "backend_url": f"sqlite:///{tmp_path / 'api.db'}",
        "cancel_poll_s": 0.1,
        "sweep_interval_s": 0.2,
        "heartbeat_s": 0.5,
        "lease_s": 5.0,
        "retry_base_s": 0.05,
        "retry_cap_s": 0.2,
    }
    config = Settings(**{**base, **settings})
    app = create_app(config, backburner=backburner, run_worker=run_worker)
    with serve_in_thread(app, log_level="warning", lifespan="on") as (server, thread):
        yield LiveServer(server, thread, config)


@contextmanager
def serve_in_thread(
    app: Any, *, port: int = 0, name: str = "uvicorn", log_level: str = "critical", **config: Any
) -> Iterator[tuple[uvicorn.Server, threading.Thread]]:
    """Run an ASGI app under uvicorn on 127.0.0.1 (``port`` 0: a free one) in a thread of
    this process, from when it listens until exit."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level=log_level, **config)
    )
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the {name} server did not start")
        time.sleep(0.01)
    try:
        yield server, thread
    finally:
        server.should_exit = True
        thread.join(30)
