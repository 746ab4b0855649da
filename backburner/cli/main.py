"""Assembles the ``backburner`` command."""

from __future__ import annotations

import typer

from . import batch, keys, remote, service


def build_cli() -> typer.Typer:
    cli = typer.Typer(
        help="backburner: long-running LLM and agent jobs behind a durable queue.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    service.register(cli)
    remote.register(cli)
    keys.register(cli)
    batch.register(cli)
    return cli


def main() -> None:
    build_cli()()
