"""Config that a setting names: a TOML or JSON file's path, or inline JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import ConfigurationError


def load_config(source: str, *, what: str, variable: str) -> dict[str, Any]:
    """The table in ``source``: inline JSON (``{...}``), or a TOML or ``.json`` file's path.
    ``what`` names it in errors ("models"), ``variable`` is the setting's variable."""
    text = source.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:  # (nested past Python's stack)
            raise ConfigurationError(f"{variable} is not valid JSON: {exc}") from None
    else:
        try:
            path = Path(text).expanduser()
        except RuntimeError as exc:  # (~nosuchuser)
            raise ConfigurationError(f"cannot read the {what} file {text}: {exc}") from None
        try:
            body = path.read_text()
        except OSError as exc:
            raise ConfigurationError(
                f"cannot read the {what} file {path}: {exc.strerror}"
            ) from None
        except UnicodeDecodeError as exc:
            raise ConfigurationError(
                f"cannot read the {what} file {path}: not UTF-8 text (byte {exc.start})"
            ) from None
        try:
            if path.suffix == ".json":
                data = json.loads(body)
            else:
                import tomllib  # (its parser, only for a TOML file)

                data = tomllib.loads(body)
        except (ValueError, RecursionError) as exc:  # (TOMLDecodeError is a ValueError)
            raise ConfigurationError(f"the {what} file {path} is not valid: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigurationError(f"the {what} config must be a table")
    return data
