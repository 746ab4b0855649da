"""What every command shares: one-line errors, settings, app loading, tables."""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from ..app import Backburner
from ..backends import backend_from_url
from ..errors import BackburnerError, ConfigurationError
from ..models import JobStatus
from ..settings import Settings

if TYPE_CHECKING:  # rich is imported where the CLI draws: `worker` and `api` never do (2.5 MB)
    from rich.console import Console
    from rich.table import Table

T = TypeVar("T")

BackendOption = Annotated[
    str | None,
    typer.Option("--backend", "-b", help="Backend URL \\[env BACKBURNER_BACKEND_URL]."),
]
ModelsOption = Annotated[
    str | None,
    typer.Option(
        "--models", help="Model routing file (TOML) or inline JSON \\[env BACKBURNER_MODELS]."
    ),
]
UrlOption = Annotated[
    str,
    typer.Option("--url", "-u", envvar="BACKBURNER_URL", help="The backburner service."),
]
AppArgument = Annotated[
    str | None,
    typer.Argument(help="Your Backburner as module:attribute (default: the built-in tasks)."),
]

COLOURS = {
    JobStatus.COMPLETED: "green",
    JobStatus.FAILED: "red",
    JobStatus.CANCELLED: "yellow",
    JobStatus.PROCESSING: "cyan",
    JobStatus.QUEUED: "white",
}


def out() -> Console:
    """The console for results. It reads no markup: what it prints holds users' data (a
    prompt with ``[/INST]`` in it), which markup altered or choked on. A line that wants a
    style asks for ``markup=True`` and escapes what it quotes."""
    from rich.console import Console

    return Console(markup=False)


def err() -> Console:
    """The console for messages, with no markup either (see ``out``)."""
    from rich.console import Console

    return Console(stderr=True, markup=False)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: message`` on one line (no wrapping) and return the Exit to raise. The
    message is text, not markup: one that quotes ``[user]`` or ``[::1]`` prints as it is."""
    from rich.markup import escape

    err().print(
        f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True, markup=True
    )
    return typer.Exit(code)


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the event loop ``choice`` (Settings.event_loop) names; None: asyncio's own.
    uvloop runs the worker's and the API's event loops with less CPU per wake-up (a Redis
    worker drains about 15% more jobs per second, measured with bench/peers.py)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            message = "event_loop is uvloop, which is not installed: pip install uvloop"
            raise fail(message, 2) from None
        return None
    return uvloop.new_event_loop


YOUNG_GC_THRESHOLD = 50_000
"""Allocations between collections of the youngest generation in a service process (Python's
default is 700)."""


def tune_gc() -> None:
    """Set a long-running service process's garbage collector for many live jobs.

    With Python's defaults a worker holding thousands of jobs spends much of its time in the
    collector, which walks every live object again and again (10,000 jobs that sleep 2 s took
    3.2-3.4 s from first start to last completion, 2.5-2.6 s without collections). Nearly all
    of a job's garbage goes by reference counting: the youngest generation is collected after
    YOUNG_GC_THRESHOLD allocations rather than 700, and what was loaded at start (modules, the
    app) is frozen out of every collection. Only the CLI's service commands do this: a process
    that embeds a worker keeps its own settings."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, middle, old)


def _stop_while_starting(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run(coro: Coroutine[Any, Any, T], event_loop: str = "asyncio") -> T:
    """Run ``coro`` on the event loop ``event_loop`` names; a BackburnerError is one line.

    SIGTERM ends the process (exit 143) until the command installs its own handling (a
    worker's drain, uvicorn's shutdown): as PID 1, as in the container images, a signal with
    no handler is ignored, and a SIGTERM that came while the process started (1 to 2 s, and
    up to a backend's connect timeout) was lost; the orchestrator then waited out its grace
    period and killed it."""
    try:
        factory = loop_factory(event_loop)
    except typer.Exit:
        coro.close()  # never run: closed, so no "never awaited" warning
        raise
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop_while_starting)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(coro)
    except BackburnerError as exc:
        raise fail(str(exc)) from None


def settings_for(backend: str | None = None, **overrides: Any) -> Settings:
    try:
        return Settings.from_env(backend_url=backend, **overrides)
    except BackburnerError as exc:
        raise fail(str(exc), 2) from None


def _where(exc: BaseException) -> str:
    """`` (at FILE:LINE)`` of the innermost frame ``exc`` went through, or nothing."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) or not frames:
        return ""
    return f" (at {frames[-1].filename}:{frames[-1].lineno})"


def load_app(path: str | None, settings: Settings, backend: str | None = None) -> Backburner:
    """Import ``module:attribute`` (a Backburner) the way uvicorn imports an app.

    None gives a Backburner with only the built-in tasks, on ``settings``. Either way the
    built-in tasks are added (unless the app has its own of the same name), so an API and its
    workers agree on what they can run.
    """
    from ..builtin import install_builtin_tasks

    try:
        if path is None:
            app = Backburner(settings=settings)
            install_builtin_tasks(app)
            return app
        module_name, _, attr = path.partition(":")
        if not module_name or not attr:
            raise ConfigurationError(f"app must look like module:attribute, got {path!r}")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from None
        except Exception as exc:  # its own error (a SyntaxError names its line itself)
            raise ConfigurationError(
                f"cannot import {module_name!r}: {type(exc).__name__}: {exc}{_where(exc)}"
            ) from None
        found = getattr(module, attr, None)
        if not isinstance(found, Backburner):
            raise ConfigurationError(f"{path!r} is not a Backburner instance")
        if backend is not None:
            found.backend = backend_from_url(backend, max_queue_size=found.settings.max_queue_size)
        if settings.models is not None:  # --models / BACKBURNER_MODELS win over the app's own
            from ..providers.routing import ModelRouter

            found.models = ModelRouter.from_source(settings.models)
            if settings.default_model is not None:
                found.models.set_default(settings.default_model)
        install_builtin_tasks(found)
        return found
    except BackburnerError as exc:
        raise fail(str(exc), 2) from None


def job_table(jobs: list[Any]) -> Table:
    """A table of jobs (library Jobs or API task views: the same field names)."""
    from rich.table import Column, Table
    from rich.text import Text

    # (an id is for copying: never cut to "task_ad64…", however narrow the terminal)
    task_id = Column("task_id", no_wrap=True, min_width=37)
    table = Table(task_id, "type", "status", "attempts", "progress", "result / error")
    for job in jobs:
        outcome = ""
        if job.error is not None:
            outcome = f"{job.error.type}: {job.error.message}"
        elif job.result is not None:
            outcome = json.dumps(job.result)[:60]
        status = JobStatus(job.status)
        table.add_row(
            job.task_id,
            job.type,
            Text(status.value, style=COLOURS[status]),
            f"{job.attempts}/{job.max_attempts}",
            f"{job.progress.percent:.0f}% {job.progress.message or ''}",
            outcome,
        )
    return table


def priority_value(value: str | None) -> int | str | None:
    """``--priority`` as the API takes it: a whole number, else a class name (which the API
    checks). (``"--5"`` or ``"²"`` passed a digit test and then broke ``int``.)"""
    if value is not None and re.fullmatch(r"[+-]?[0-9]+", value.strip()):
        return int(value)
    return value


def print_json(value: Any) -> None:
    out().print_json(json.dumps(value))
