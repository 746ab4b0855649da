"""Task definitions: a name, an async handler and its default policy."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import ConfigurationError, InvalidInputError

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
    validate: Callable[[dict[str, Any]], None] | None = None
    """Checks an input that binds (raising InvalidInputError to refuse it): at submission, so a
    bad value is a 422 with nothing stored, and again before each run."""
    signature: inspect.Signature = field(init=False, repr=False, compare=False)
    _required: frozenset[str] = field(init=False, repr=False, compare=False)
    _allowed: frozenset[str] | None = field(init=False, repr=False, compare=False)
    _unreachable: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_handler(self.name, self.handler)
        signature = inspect.signature(self.handler)
        object.__setattr__(self, "signature", signature)
        ctx_param, *params = signature.parameters.values()
        keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        # A positional-only parameter can never be given, so one without a default is a
        # requirement no input meets (check_input then lets Signature.bind explain).
        required = {
            p.name
            for p in params
            if p.default is p.empty and (p.kind in keyword or p.kind is p.POSITIONAL_ONLY)
        }
        allowed = {p.name for p in params if p.kind in keyword}
        var_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        # Input arrives as keyword arguments only: these names can never be given that way.
        unreachable = {ctx_param.name} | {
            p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY
        }
        object.__setattr__(self, "_required", frozenset(required))
        object.__setattr__(self, "_allowed", None if var_keyword else frozenset(allowed))
        object.__setattr__(self, "_unreachable", frozenset(unreachable))

    def check_input(self, payload: dict[str, Any]) -> None:
        """Raise InvalidInputError unless ``handler(ctx, **payload)`` would bind."""
        keys = payload.keys()
        if self._required <= keys and (self._allowed is None or keys <= self._allowed):
            if not self._unreachable.isdisjoint(keys):
                name = sorted(self._unreachable & keys)[0]
                raise InvalidInputError(
                    f"input does not fit task {self.name!r}: {name!r} cannot be passed by keyword"
                )
        else:
            try:
                self.signature.bind(None, **payload)
            except TypeError as exc:
                raise InvalidInputError(f"input does not fit task {self.name!r}: {exc}") from None
        if self.validate is not None:
            self.validate(payload)

    def call(self, ctx: JobContext, payload: dict[str, Any]) -> Awaitable[Any]:
        return self.handler(ctx, **payload)


def validate_handler(name: str, handler: Handler) -> None:
    if not inspect.iscoroutinefunction(handler):
        raise ConfigurationError(f"task {name!r} must be an async function (async def)")
    params = list(inspect.signature(handler).parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise ConfigurationError(f"task {name!r} must take the job context as its first argument")
