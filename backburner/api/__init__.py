"""The HTTP API (FastAPI): ``create_app(settings)``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    # Lazy, so the client can use the API's schemas without importing FastAPI and the app.
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(name)
