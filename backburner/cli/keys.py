"""``backburner keys``: make, list and revoke API keys (the file keeps only their hashes)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Annotated

import typer

from ..errors import BackburnerError
from ..keys import KeysFile
from .common import fail, out

DEFAULT_KEYS_FILE = "backburner-keys.json"
"""Where keys go when no ``--keys-file`` or BACKBURNER_KEYS_FILE says; ``backburner serve``
and ``api`` read it from the working directory when it exists."""

KeysFileOption = Annotated[
    str,
    typer.Option(
        "--keys-file",
        envvar="BACKBURNER_KEYS_FILE",
        help="The keys file (JSON of key hashes).",
    ),
]

keys = typer.Typer(help="API keys: each maps to a tenant; the file holds only hashes.")


@keys.command()
def create(
    tenant: Annotated[str, typer.Option(help="The tenant the key acts for.")],
    admin: Annotated[
        bool, typer.Option("--admin", help="Also DLQ, stats and every tenant's jobs.")
    ] = False,
    name: Annotated[str | None, typer.Option(help="A note to tell keys apart.")] = None,
    keys_file: KeysFileOption = DEFAULT_KEYS_FILE,
) -> None:
    """Make a key for TENANT, store its hash, and print the key once (it is kept nowhere)."""
    try:
        key = KeysFile(keys_file).create(tenant, admin=admin, name=name)
    except (BackburnerError, OSError) as exc:
        raise fail(str(exc), 2) from None
    typer.echo(key)
    kind = "admin key" if admin else "key"
    typer.echo(
        f"{kind} for tenant {tenant!r} stored (hash only) in {Path(keys_file).resolve()};"
        " copy it now: it is not shown again",
        err=True,
    )


@keys.command("list")
def list_keys(keys_file: KeysFileOption = DEFAULT_KEYS_FILE) -> None:
    """The keys in the file: id, tenant, admin, name, created (never the keys themselves)."""
    try:
        stored = KeysFile(keys_file).read()
    except BackburnerError as exc:
        raise fail(str(exc), 2) from None
    console = out()
    if not stored:
        console.print(f"no keys in {keys_file}")
        return
    for key in stored:
        when = datetime.datetime.fromtimestamp(key.created_at, datetime.UTC)
        console.print(
            f"{key.id}  tenant={key.tenant}  {'admin  ' if key.admin else ''}"
            f"created={when:%Y-%m-%d %H:%M}Z{'  ' + key.name if key.name else ''}",
            highlight=False,
            soft_wrap=True,
        )


@keys.command()
def revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (from `backburner keys list`).")],
    keys_file: KeysFileOption = DEFAULT_KEYS_FILE,
) -> None:
    """Remove a key; running APIs stop accepting it within a second."""
    try:
        removed = KeysFile(keys_file).revoke(key_id)
    except (BackburnerError, OSError) as exc:
        raise fail(str(exc), 2) from None
    if not removed:
        raise fail(f"no key {key_id!r} in {keys_file}", 1)
    typer.echo(f"revoked {key_id}")


def register(cli: typer.Typer) -> None:
    cli.add_typer(keys, name="keys")
