"""The ASGI application: ``create_app(settings)``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import AsyncIterator
from types import FrameType
from typing import Any

from fastapi import FastAPI

from .. import __version__
from ..app import Backburner
from ..builtin import install_builtin_tasks
from ..settings import Settings
from ..worker import Worker
from .batches import BATCHES, batch_body_limit, build_batch_router
from .errors import install_error_handlers
from .events import EventHub
from .limits import BodyLimitMiddleware, SingleQueryValuesMiddleware
from .routes import Api, build_router

log = logging.getLogger("backburner.api")


class _ShutdownSignals:
    """SIGINT and SIGTERM, which the server (uvicorn) took for itself, also reach the app.

    Each closes this process's open event streams at once (their clients resume with
    Last-Event-ID, from another API process or after the restart): otherwise they held the
    server's shutdown until it cut them, with a traceback each. And they reach the embedded
    worker, if any, as they reach ``backburner worker``: the first stops its claiming, a second
    hands its running jobs back at once; the worker heard neither and ran out its whole grace.
    The server's own handler hears the first signal only: a second would make uvicorn skip
    the application's shutdown (where the worker winds down) and end in a traceback."""

    def __init__(self, hub: EventHub, worker: Worker | None) -> None:
        self.hub = hub
        self.worker = worker
        self.heard = 0
        self._loop = asyncio.get_running_loop()
        self._before: dict[int, Any] = {}

    def __enter__(self) -> _ShutdownSignals:
        if threading.current_thread() is threading.main_thread():  # (signals reach it only)
            for which in (signal.SIGINT, signal.SIGTERM):
                self._before[which] = signal.signal(which, self._forward)
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._before.items():
            signal.signal(number, handler)

    def _forward(self, sig: int, frame: FrameType | None) -> None:
        self.heard += 1
        self._loop.call_soon_threadsafe(self.hub.drain)
        if self.worker is not None:
            self._loop.call_soon_threadsafe(self.worker.shutdown)
        handler = self._before[sig]
        if self.heard == 1 and callable(handler):
            handler(sig, frame)


def create_app(
    settings: Settings | None = None,
    *,
    backburner: Backburner | None = None,
    run_worker: bool = False,
    worker_concurrency: int | None = None,
    handle_signals: bool = False,
    signals_to_worker: bool = False,
) -> FastAPI:
    """The HTTP API over ``backburner`` (default: the built-in tasks on settings.backend_url).

    With ``run_worker`` a worker runs in the same process (``backburner serve``). With
    ``handle_signals``, SIGINT and SIGTERM close the open event streams at once (clients
    resume them) and reach that worker while the app runs (the first stops its claiming, a
    second hands its jobs back): for a server of one process that gets each signal once, as
    ``backburner serve`` and ``backburner api`` run uvicorn. Under ``uvicorn --workers`` or
    ``--reload`` a Ctrl-C reaches each server process twice (the terminal's SIGINT, then the
    supervisor's SIGTERM), which would count as a second signal. ``signals_to_worker`` is
    its earlier name.
    """
    handle_signals = handle_signals or signals_to_worker
    settings = settings or (backburner.settings if backburner else Settings.from_env())
    bb = backburner or Backburner(settings=settings)
    install_builtin_tasks(bb)
    api = Api(bb, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await bb.connect()
        worker_task: asyncio.Task[None] | None = None
        worker = None
        if run_worker:
            worker = bb.worker(concurrency=worker_concurrency or settings.concurrency)
            worker_task = asyncio.create_task(worker.run())
        with contextlib.ExitStack() as signals:
            heard = None
            if handle_signals:
                heard = signals.enter_context(_ShutdownSignals(api.hub, worker))
            try:
                yield
            finally:
                await api.hub.close()
                if worker is not None and worker_task is not None:
                    if heard is None or not heard.heard:  # (stopping for a reason of its own)
                        worker.shutdown()
                    await worker_task
            await bb.close()

    app = FastAPI(
        title="backburner",
        version=__version__,
        summary="Long-running LLM and agent jobs: 202 + task id, poll, stream, cancel.",
        lifespan=lifespan,
    )
    app.state.api = api
    app.state.keys = api.keys
    router = build_router(api)
    router.include_router(build_batch_router(api))
    install_error_handlers(app, router.routes)
    app.include_router(router)
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        routes={BATCHES: batch_body_limit(settings.max_batch_bytes)},
    )
    app.add_middleware(SingleQueryValuesMiddleware)
    return app
