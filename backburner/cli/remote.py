"""Commands that talk to a running service over HTTP: submit, status, cancel, tasks, dlq."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer

from ..errors import AuthError, BackburnerError
from ..models import JobStatus
from .common import UrlOption, err, fail, job_table, out, print_json, priority_value

DEFAULT_URL = "http://127.0.0.1:8000"


@contextmanager
def _session(url: str) -> Iterator[Any]:
    """A client for ``url``; any backburner error becomes the one-line CLI error."""
    from ..client import Client

    try:
        with Client(url) as client:
            yield client
    except AuthError as exc:  # (the API's words name a header a CLI user cannot set)
        sent = "the key in BACKBURNER_API_KEY was refused"
        if not os.environ.get("BACKBURNER_API_KEY"):
            sent = "set BACKBURNER_API_KEY to one"
        raise fail(f"{exc} ({sent})") from None
    except BackburnerError as exc:
        raise fail(str(exc)) from None


def _dump(task: Any) -> Any:
    return task.model_dump(mode="json")


def submit(
    prompt: Annotated[str, typer.Argument(help="The prompt for the built-in generate task.")],
    url: UrlOption = DEFAULT_URL,
    model: Annotated[str | None, typer.Option(help="The model name.")] = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="Most tokens to generate.")] = 256,
    priority: Annotated[
        str | None,
        typer.Option(help="-100..100, higher first, or a class: interactive, default, batch."),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Show a progress bar until done.")] = False,
    stream: Annotated[bool, typer.Option("--stream", help="Print tokens as they come.")] = False,
) -> None:
    """Submit a generation; print its id, or follow it with --wait or --stream."""
    if wait and stream:
        raise fail("give --wait or --stream, not both", 2)
    with _session(url) as client:
        level = priority_value(priority)
        submission = client.generate(prompt, model=model, max_tokens=max_tokens, priority=level)
        task_id = submission.task_id
        if not (wait or stream):
            print_json(submission.model_dump(mode="json"))
            return
        # At once, on stderr: a follow cut short (Ctrl-C, a lost connection) leaves a job
        # running, and its id is how to find it again.
        err().print(f"task {task_id}", highlight=False, soft_wrap=True)
        if stream:
            _print_tokens(client, task_id)
        else:
            _progress_bar(client, task_id)
        task = client.get(task_id)
    if stream:
        out().print()
        if task.status != JobStatus.COMPLETED:
            raise fail(f"task {task_id} ended {task.status}: {_why(task)}")
        return
    print_json(_dump(task))
    if task.status != JobStatus.COMPLETED:
        raise typer.Exit(1)


def _why(task: Any) -> str:
    return task.error.message if task.error is not None else "no error recorded"


def _print_tokens(client: Any, task_id: str) -> None:
    console = out()
    attempt = None
    for event in client.stream(task_id):
        if event.type == "token" and isinstance(event.data, dict):
            if attempt is not None and event.data.get("attempt") != attempt:
                console.print("\n[retried: the text starts over]", highlight=False, markup=False)
            attempt = event.data.get("attempt")
            console.print(event.data.get("text", ""), end="", highlight=False, markup=False)


def _progress_bar(client: Any, task_id: str) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err(), transient=True) as bar:  # (stdout: the JSON alone)
        row = bar.add_task(task_id, total=100)
        for event in client.stream(task_id):
            if event.type == "progress" and isinstance(event.data, dict):
                percent = float(event.data.get("percent") or 0)
                bar.update(row, completed=percent, description=event.data.get("message") or "")
            elif event.type == "status" and isinstance(event.data, dict):
                bar.update(row, description=str(event.data.get("status")))
        bar.update(row, completed=100)


def status(task_id: str, url: UrlOption = DEFAULT_URL) -> None:
    """Print a task."""
    with _session(url) as client:
        print_json(_dump(client.get(task_id)))


def cancel(task_id: str, url: UrlOption = DEFAULT_URL) -> None:
    """Cancel a task (idempotent) and print it."""
    with _session(url) as client:
        print_json(_dump(client.cancel(task_id)))


def tasks(
    url: UrlOption = DEFAULT_URL,
    status: Annotated[str | None, typer.Option(help="queued, processing, ...")] = None,
    type: Annotated[str | None, typer.Option(help="Only this task type.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
) -> None:
    """List tasks, newest first."""
    if status is not None and status not in {s.value for s in JobStatus}:
        raise fail(f"unknown status {status!r}", 2)
    with _session(url) as client:
        page = client.list(status=status, type=type, limit=limit)
    _show(page.data, as_json)


def _show(items: list[Any], as_json: bool) -> None:
    if as_json:
        out().print(json.dumps([_dump(t) for t in items]), highlight=False, soft_wrap=True)
    else:
        out().print(job_table(items))


def dlq_ls(
    url: UrlOption = DEFAULT_URL,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
) -> None:
    """List failed tasks with their last error."""
    with _session(url) as client:
        page = client.dead_letters(limit=limit)
    _show(page.data, as_json)


def dlq_replay(task_id: str, url: UrlOption = DEFAULT_URL) -> None:
    """Re-queue a failed task with a fresh attempt budget (its history is kept)."""
    with _session(url) as client:
        print_json(_dump(client.replay(task_id)))


def register(cli: typer.Typer) -> None:
    for command in (submit, status, cancel, tasks):
        cli.command()(command)
    dlq = typer.Typer(help="The dead-letter queue: failed tasks.", no_args_is_help=True)
    dlq.command("ls")(dlq_ls)
    dlq.command("replay")(dlq_replay)
    cli.add_typer(dlq, name="dlq")
