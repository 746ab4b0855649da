"""``backburner batch``: submit a JSONL file of prompts as one batch, follow it, get results."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

from ..models import JobStatus
from .common import UrlOption, err, fail, print_json, priority_value
from .remote import DEFAULT_URL, _session


def read_requests(path: Path) -> list[dict[str, Any]]:
    """The requests of a JSONL file: each line ``{"custom_id"?, "prompt" | "messages", ...}``
    (or a bare JSON string: the prompt); blank lines skipped; a line without custom_id gets
    its line number. Raises typer.Exit with a one-line error naming the bad line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"cannot read {path}: {exc}", 2) from None
    requests: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise fail(f"{path}:{number}: not JSON: {exc}", 2) from None
        if isinstance(item, str):
            item = {"prompt": item}
        if not isinstance(item, dict):
            raise fail(f"{path}:{number}: each line must be a JSON object (or a string)", 2)
        item.setdefault("custom_id", str(number))
        requests.append(item)
    if not requests:
        raise fail(f"{path} holds no requests", 2)
    return requests


def submit(
    file: Annotated[
        Path,
        typer.Argument(
            help='JSONL, a request a line: {"custom_id"?, "prompt" | "messages", "model"?,'
            ' "max_tokens"?, ...} or a bare "prompt"; custom_id defaults to the line number.',
            show_default=False,
        ),
    ],
    url: UrlOption = DEFAULT_URL,
    model: Annotated[
        str | None, typer.Option(help="The model of every request that names none.")
    ] = None,
    priority: Annotated[
        str | None,
        typer.Option(help="-100..100, higher first, or a class: interactive, default, batch."),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Show a progress bar until the batch ends.")
    ] = False,
) -> None:
    """Submit a JSONL file of requests as one batch; print it, or follow it with --wait."""
    requests = read_requests(file)
    with _session(url) as client:
        batch = client.submit_batch(requests, model=model, priority=priority_value(priority))
        if wait:
            err().print(f"batch {batch.batch_id}", highlight=False, soft_wrap=True)
            batch = _follow(client, batch)
    print_json(batch.model_dump(mode="json"))
    if wait and batch.status != JobStatus.COMPLETED:
        raise typer.Exit(1)


def _follow(client: Any, submitted: Any) -> Any:
    """Poll the batch until it ends, with a progress bar of requests done (on stderr)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
    )
    batch = submitted
    with Progress(*columns, console=err(), transient=True) as bar:
        row = bar.add_task(batch.batch_id, total=batch.request_counts.total, detail="")
        for batch in client.poll_batch(submitted.batch_id, max_poll_interval=5.0):
            counts = batch.request_counts
            detail = f"{counts.failed} failed" if counts.failed else ""
            bar.update(row, completed=batch.done, description=batch.status.value, detail=detail)
    return batch


def status(batch_id: str, url: UrlOption = DEFAULT_URL) -> None:
    """Print a batch: its status and request_counts."""
    with _session(url) as client:
        print_json(client.batch(batch_id).model_dump(mode="json"))


def results(
    batch_id: str,
    url: UrlOption = DEFAULT_URL,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file (default: stdout).")
    ] = None,
) -> None:
    """Print (or write) the batch's results as JSON Lines: one per finished request."""
    with _session(url) as client:
        rows = client.batch_results(batch_id)
        if output is None:
            _write_rows(rows, sys.stdout)
            return
        stream = str(output).startswith(("/dev/", "/proc/"))  # (/dev/stdout >> file: a file)
        if stream or (output.exists() and not output.is_file()):  # a pipe: written as it is
            try:
                with output.open("w", encoding="utf-8") as sink:
                    count = _write_rows(rows, sink)
            except OSError as exc:
                raise fail(f"cannot write {output}: {exc}") from None
        else:
            # Into a file beside it, which replaces it once every row is in: a request that
            # fails (an unknown id, a lost server) leaves what was there before. (A link's
            # target is what gets replaced, not the link.)
            target = output.resolve()
            partial = target.with_name(f".{target.name}.{os.getpid()}.part")
            try:
                with partial.open("w", encoding="utf-8") as sink:
                    count = _write_rows(rows, sink)
                partial.replace(target)
            except OSError as exc:
                raise fail(f"cannot write {output}: {exc}") from None
            finally:
                partial.unlink(missing_ok=True)
    err().print(f"wrote {count} results to {output}", highlight=False, soft_wrap=True)


def _write_rows(rows: Iterable[dict[str, Any]], sink: TextIO) -> int:
    count = 0
    for row in rows:
        sink.write(json.dumps(row, ensure_ascii=False) + "\n")
        count += 1
    return count


def cancel(batch_id: str, url: UrlOption = DEFAULT_URL) -> None:
    """Cancel a batch (idempotent) and print it."""
    with _session(url) as client:
        print_json(client.cancel_batch(batch_id).model_dump(mode="json"))


def register(cli: typer.Typer) -> None:
    batch = typer.Typer(
        help="Batches: many prompts as one job (POST /v1/batches).", no_args_is_help=True
    )
    for command in (submit, status, results, cancel):
        batch.command()(command)
    cli.add_typer(batch, name="batch")
