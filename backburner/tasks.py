"""Task definitions: a name, an async handler and its default policy."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import InvalidInputError

if TYPE_CHECKING:
    from .context import JobContext

Handler = Callable[..., Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class TaskDefinition:
    """A registered task. ``None`` fields fall back to the app's Settings."""

    name: str
    handler: Handler
    max_attempts: int | None = None
    timeout_s: float | None = None
    deadline_s: float | None = None
    ttl_s: float | None = None
    priority: int = 0
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    permanent_on: tuple[type[BaseException], ...] = ()
    signature: inspect.Signature = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_handler(self.name, self.handler)
        object.__setattr__(self, "signature", inspect.signature(self.handler))

    def check_input(self, payload: dict[str, Any]) -> None:
        """Raise InvalidInputError unless ``handler(ctx, **payload)`` would bind."""
        try:
            self.signature.bind(None, **payload)
        except TypeError as exc:
            raise InvalidInputError(f"input does not fit task {self.name!r}: {exc}") from None

    def call(self, ctx: JobContext, payload: dict[str, Any]) -> Awaitable[Any]:
        return self.handler(ctx, **payload)


def validate_handler(name: str, handler: Handler) -> None:
    if not inspect.iscoroutinefunction(handler):
        raise TypeError(f"task {name!r} must be an async function (async def)")
    params = list(inspect.signature(handler).parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise TypeError(f"task {name!r} must take the job context as its first argument")
