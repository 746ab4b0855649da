"""Commands that run backburner: serve, api, worker, demo, and enqueue (straight to storage)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

import typer

from ..app import Backburner
from ..backends.urls import redacted
from ..errors import BackburnerError
from ..keys import KeyRing
from ..models import Job
from ..observability.logs import configure_logging
from ..observability.tracing import configure_from_env
from ..settings import Settings
from .common import (
    AppArgument,
    BackendOption,
    ModelsOption,
    fail,
    job_table,
    load_app,
    loop_factory,
    out,
    print_json,
    run,
    settings_for,
    tune_gc,
)
from .keys import DEFAULT_KEYS_FILE

HostOption = Annotated[str | None, typer.Option(help="Interface to listen on [127.0.0.1].")]
InsecureOption = Annotated[
    bool,
    typer.Option(
        "--insecure",
        help="Serve without API keys on an address other than loopback (anyone who can reach"
        " it may use the API).",
    ),
]
PortOption = Annotated[int | None, typer.Option(help="Port to listen on [8000].")]
ConcurrencyOption = Annotated[int | None, typer.Option(help="Jobs one worker runs at once.")]
LogLevelOption = Annotated[str, typer.Option(help="debug, info, warning, error")]
LogFormatOption = Annotated[
    str,
    typer.Option(
        envvar="BACKBURNER_LOG_FORMAT",
        help="auto (JSON lines unless on a terminal), json or text.",
    ),
]


def _logging(level_name: str, log_format: str = "auto") -> None:
    level = getattr(logging, level_name.upper(), None)
    if not isinstance(level, int):
        raise fail(f"unknown log level {level_name!r}", 2)
    if log_format not in ("auto", "json", "text"):
        raise fail(f"unknown log format {log_format!r} (auto, json, text)", 2)
    configure_logging(level, json_lines=None if log_format == "auto" else log_format == "json")
    configure_from_env()  # OTLP spans, when OTEL_EXPORTER_OTLP_ENDPOINT says where


def _check_port(host: str, port: int) -> None:
    """Fail in one line now rather than in uvicorn's log later."""
    if not 0 < port < 65536:
        raise fail(f"cannot listen on {host}:{port}: a port is 1..65535", 2)
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}", 2) from None


@contextlib.asynccontextmanager
async def serve_metrics(bb: Backburner, host: str, port: int) -> AsyncIterator[None]:
    """Serve ``bb.metrics`` (``/metrics``) and a liveness probe (``/healthz``) over HTTP from a
    thread while the body runs; the gauges are refreshed from the backend every 5 s."""
    from ..observability.metrics import CONTENT_TYPE
    from ..observability.ops_server import TICK_S, OpsServer

    ops = OpsServer(
        host,
        port,
        render=bb.metrics.render,
        content_type=CONTENT_TYPE,
        stall_s=bb.settings.lease_s,
    )
    ops.start()

    async def tick() -> None:
        while True:
            ops.tick()
            await asyncio.sleep(TICK_S)

    async def refresh() -> None:
        while True:
            try:
                await bb.metrics.refresh(bb.backend, now=bb.clock.now())
            except Exception as exc:  # marked stale (backend_up 0) meanwhile
                logging.getLogger("backburner.metrics").warning("metrics refresh: %s", exc)
            await asyncio.sleep(5.0)

    helpers = [asyncio.create_task(refresh()), asyncio.create_task(tick())]
    try:
        yield
    finally:
        for task in helpers:
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        ops.stop()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _with_keys(settings: Settings, insecure: bool) -> tuple[Settings, str | None]:
    """Settings with the working directory's keys file when none is named, and the warning
    to print if the API is keyless; refuses (exit 2) to serve keyless beyond loopback unless
    ``insecure``."""
    if settings.keys_file is None and Path(DEFAULT_KEYS_FILE).exists():
        settings = settings.replace(keys_file=DEFAULT_KEYS_FILE)
    try:
        keyless = KeyRing(settings).open
    except BackburnerError as exc:
        raise fail(str(exc), 2) from None
    if not keyless:
        return settings, None
    where = f"{settings.host}:{settings.port}"
    if not _is_loopback(settings.host) and not insecure:
        raise fail(
            f"refusing to serve on {where} without API keys: make one with"
            " `backburner keys create --tenant NAME` (or set BACKBURNER_API_KEYS), or pass"
            " --insecure",
            2,
        )
    warning = f"no API keys, so anyone who can reach {where} may use the API"
    return settings, warning + ("" if insecure else " (fine on loopback, for local development)")


def _serve_http(
    bb: Backburner, settings: Settings, *, run_worker: bool, level: str, warning: str | None
) -> None:
    import uvicorn
    from rich.markup import escape

    from ..api import create_app

    # The app's own setting, as for everything else the worker runs by (the environment's, for
    # the built-in app); one that is not installed fails here, in a line.
    event_loop = bb.settings.event_loop
    loop_factory(event_loop)
    _check_port(settings.host, settings.port)
    # The backend, once, before the server: a Redis that is down, a SQLite file that cannot
    # be opened, is a line here, not uvicorn's traceback of its failed startup.
    run(_reachable(bb), event_loop)
    if warning is not None:  # (a log line: one JSON object under --log-format json)
        logging.getLogger("backburner.api").warning(warning)
    url = f"http://{settings.host}:{settings.port}"
    console = out()
    role = "API and worker" if run_worker else "API"
    console.print(
        f"backburner {role} on [bold]{escape(url)}[/]"
        f"  (backend {escape(redacted(settings.backend_url))})",
        markup=True,
        soft_wrap=True,
    )
    if run_worker:
        console.print(_model_line(bb), highlight=False, soft_wrap=True)
    if not settings.webhook_secret:
        console.print(
            "webhooks: not signed, so not sent, until BACKBURNER_WEBHOOK_SECRET is set"
            " (backburner webhook-secret makes one)",
            highlight=False,
            soft_wrap=True,
        )
    console.print(
        f"try:  curl -s -X POST {url}/v1/generate -H 'Content-Type: application/json'"
        """ -d '{"prompt": "Hello"}'""",
        highlight=False,
        soft_wrap=True,
    )
    app = create_app(
        settings,
        backburner=bb,
        run_worker=run_worker,
        worker_concurrency=settings.concurrency,
        handle_signals=True,  # (uvicorn.run below: one process, which takes the signals)
    )
    tune_gc()
    # From here uvicorn takes SIGTERM (and, once stopped, raises it again to end the process
    # as the signal would): the default again, not run()'s handler for the start-up.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # The app's signal handler closes open event streams at once (their clients resume with
    # Last-Event-ID elsewhere); the grace is for requests that are not streams.
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=level.lower(),
        log_config=None,  # uvicorn's records go through our handler: JSON lines off a terminal
        loop=event_loop,
        timeout_graceful_shutdown=5,
    )


async def _reachable(bb: Backburner) -> None:
    try:
        await bb.connect()
    finally:
        await bb.close()


def _model_line(bb: Backburner) -> str:
    route = bb.models.route(None)
    if route.provider == "simulated":
        return (
            f"model: {route.name} (a built-in simulator, not a real model). For a real one: "
            f"pip install 'backburner[local]', or --models FILE naming an OpenAI-compatible URL"
        )
    from ..providers.openai import without_userinfo  # (httpx: only where it is used)

    where = without_userinfo(route.base_url) if route.base_url else "on this machine"
    return f"model: {route.name} ({route.provider}, {where}); models: {', '.join(bb.models.routes)}"


def serve(
    app: AppArgument = None,
    backend: BackendOption = None,
    host: HostOption = None,
    port: PortOption = None,
    concurrency: ConcurrencyOption = None,
    models: ModelsOption = None,
    log_level: LogLevelOption = "info",
    log_format: LogFormatOption = "auto",
    insecure: InsecureOption = False,
) -> None:
    """Run the HTTP API and a worker in one process (SQLite by default): the zero-setup service."""
    _logging(log_level, log_format)
    settings = settings_for(backend, host=host, port=port, concurrency=concurrency, models=models)
    settings, warning = _with_keys(settings, insecure)
    bb = load_app(app, settings, backend)
    if not bb.models.default_is_set and "local" in bb.models.routes:  # the real offline model
        bb.models.set_default("local")
    _serve_http(bb, settings, run_worker=True, level=log_level, warning=warning)


def api(
    app: AppArgument = None,
    backend: BackendOption = None,
    host: HostOption = None,
    port: PortOption = None,
    models: ModelsOption = None,
    log_level: LogLevelOption = "info",
    log_format: LogFormatOption = "auto",
    insecure: InsecureOption = False,
) -> None:
    """Run the HTTP API only (run workers with `backburner worker`)."""
    _logging(log_level, log_format)
    settings = settings_for(backend, host=host, port=port, models=models)
    settings, warning = _with_keys(settings, insecure)
    bb = load_app(app, settings, backend)
    _serve_http(bb, settings, run_worker=False, level=log_level, warning=warning)


def worker(
    app: AppArgument = None,
    backend: BackendOption = None,
    concurrency: ConcurrencyOption = None,
    models: ModelsOption = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(help="Serve this worker's Prometheus metrics on this port (on --host)."),
    ] = None,
    host: HostOption = None,
    log_level: LogLevelOption = "info",
    log_format: LogFormatOption = "auto",
) -> None:
    """Run a worker until SIGTERM/SIGINT (graceful; a second signal: at once)."""
    _logging(log_level, log_format)
    if concurrency is not None and concurrency < 1:
        raise fail("--concurrency must be >= 1", 2)
    settings = settings_for(backend, models=models, host=host)
    bb = load_app(app, settings, backend)

    async def go() -> None:
        async with bb:
            if metrics_port is None:
                await bb.run_worker(concurrency=concurrency)
                return
            _check_port(settings.host, metrics_port)
            async with serve_metrics(bb, settings.host, metrics_port):
                await bb.run_worker(concurrency=concurrency)

    tune_gc()
    run(go(), bb.settings.event_loop)  # the app's setting, like everything the worker runs by


def enqueue(
    app: Annotated[str, typer.Argument(help="Your Backburner as module:attribute.")],
    task: Annotated[str, typer.Argument(help="The task name.")],
    input: Annotated[str, typer.Option("--input", "-i", help="The input as JSON.")] = "{}",
    priority: Annotated[int | None, typer.Option(help="-100..100, higher first.")] = None,
    idempotency_key: Annotated[str | None, typer.Option()] = None,
    delay: Annotated[float | None, typer.Option(help="Seconds before it may run.")] = None,
    backend: BackendOption = None,
) -> None:
    """Enqueue a job straight into the backend (no API server needed) and print it."""
    try:
        payload = json.loads(input)
    except (ValueError, RecursionError) as exc:  # (nested past Python's stack)
        raise fail(f"--input is not valid JSON: {exc}", 2) from None
    bb = load_app(app, settings_for(backend), backend)

    async def go() -> Job:
        async with bb:
            return await bb.enqueue(
                task, payload, priority=priority, idempotency_key=idempotency_key, delay=delay
            )

    print_json(run(go()).model_dump(mode="json"))


def demo(
    backend: BackendOption = None,
    jobs: Annotated[int, typer.Option(help="How many simulated summaries to run.")] = 4,
) -> None:
    """Run a worker and a handful of demo jobs on the embedded backend, live."""
    from ..demo import make_demo_app

    if not 1 <= jobs <= 1000:
        raise fail("--jobs must be within 1..1000", 2)
    settings = settings_for(backend)
    try:
        bb = make_demo_app(settings.backend_url, settings)
    except Exception as exc:
        raise fail(str(exc), 2) from None
    run(_demo(bb, jobs))


async def _demo(bb: Backburner, count: int) -> None:
    from rich.markup import escape

    console = out()
    async with bb:
        worker = bb.worker(concurrency=50)
        running = asyncio.create_task(worker.run())
        ids = [
            (
                await bb.enqueue(
                    "simulated_summary", {"text": f"document {i}", "tokens": 8 + 4 * i}
                )
            ).task_id
            for i in range(count)
        ]
        ids.append((await bb.enqueue("flaky_call", {"fail_times": 1})).task_id)
        ids.append((await bb.enqueue("broken_call", {})).task_id)
        console.print(
            f"backend: [bold]{escape(redacted(bb.settings.backend_url))}[/]"
            f"  worker: {escape(worker.worker_id)}",
            markup=True,
        )
        from rich.live import Live

        with Live(console=console, refresh_per_second=10) as live:
            while True:
                current = [await bb.get(task_id) for task_id in ids]
                live.update(job_table(current))
                if all(job.is_terminal for job in current):
                    break
                await asyncio.sleep(0.1)
        worker.shutdown()
        await running
        console.print()
        dead = await bb.dead_letters(limit=5)
        console.print(
            f"{len(dead.jobs)} job(s) in the dead-letter queue (see them with"
            " `backburner dlq ls` while `backburner serve` runs)"
        )


def webhook_secret() -> None:
    """Print a new webhook signing secret (set it as BACKBURNER_WEBHOOK_SECRET)."""
    from ..webhooks import generate_secret

    typer.echo(generate_secret())


def register(cli: typer.Typer) -> None:
    for command in (serve, api, worker, enqueue, demo):
        cli.command()(command)
    cli.command("webhook-secret")(webhook_secret)
