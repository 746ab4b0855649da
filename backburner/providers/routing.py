"""Model routing: a model name → its provider, limits, fallbacks and prices.

Configured by a TOML file (or the same as JSON, inline in ``BACKBURNER_MODELS``)::

    default_model = "gpt-4o-mini"

    [models.gpt-4o-mini]
    provider = "openai"                      # openai | local | simulated
    base_url = "https://api.openai.com/v1"
    api_key_env = "OPENAI_API_KEY"           # the variable that holds the key
    max_concurrent = 20                      # calls at once, across every worker process
    fallback = ["llama3"]                    # where a retry goes after a retryable failure
    input_usd_per_mtok = 0.15                # prices per million tokens, for usage.cost_usd
    output_usd_per_mtok = 0.60

The routes ``simulated`` (a simulator, not a model) and, when ``backburner[local]`` is
installed, ``local`` (Gemma 3 270M on this machine) exist unless the file redefines them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..configfile import load_config as load_file
from ..errors import ConfigurationError, ModelNotFoundError, ProviderAuthError
from .base import Provider, Usage
from .local import INSTALL_HINT, local_available

KINDS = ("openai", "local", "simulated")
_ROUTE_KEYS = {
    "provider",
    "upstream",
    "base_url",
    "api_key_env",
    "max_concurrent",
    "fallback",
    "input_usd_per_mtok",
    "output_usd_per_mtok",
    "options",
}
_OPTION_KEYS = {
    "openai": {
        "timeout_s",
        "connect_timeout_s",
        "read_timeout_s",
        "headers",
        "max_connections",
        "stream_usage",
    },
    "local": {"model_path", "context_tokens", "threads", "temperature"},
    "simulated": {
        "time_to_first_token_s",
        "tokens_per_s",
        "fail",
        "fail_times",
        "retry_after_s",
        "timeout_s",
        "context_tokens",
    },
}


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """Where one model name goes."""

    name: str
    provider: str
    upstream: str
    """The model's name at the provider (defaults to ``name``)."""
    base_url: str | None = None
    api_key_env: str | None = None
    max_concurrent: int | None = None
    fallback: tuple[str, ...] = ()
    input_usd_per_mtok: float | None = None
    output_usd_per_mtok: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def cost_usd(self, usage: Usage) -> float | None:
        """What ``usage`` cost at this route's prices; None when it has none."""
        if self.input_usd_per_mtok is None and self.output_usd_per_mtok is None:
            return None
        cost = usage.input_tokens * (self.input_usd_per_mtok or 0.0)
        cost += usage.output_tokens * (self.output_usd_per_mtok or 0.0)
        return cost / 1_000_000


def _route(name: str, raw: Any) -> ModelRoute:
    where = f"models.{name}"
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{where} must be a table")
    unknown = set(raw) - _ROUTE_KEYS
    if unknown:
        raise ConfigurationError(f"{where}: unknown keys {sorted(unknown)}")
    kind = raw.get("provider")
    if kind not in KINDS:
        raise ConfigurationError(f"{where}.provider must be one of {list(KINDS)}, got {kind!r}")
    base_url = raw.get("base_url")
    if kind == "openai" and not (isinstance(base_url, str) and _is_http_url(base_url)):
        raise ConfigurationError(f"{where}.base_url must be an http(s) URL for provider openai")
    limit = raw.get("max_concurrent")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ConfigurationError(f"{where}.max_concurrent must be an integer >= 1")
    fallback = raw.get("fallback", [])
    if not isinstance(fallback, list) or not all(isinstance(f, str) for f in fallback):
        raise ConfigurationError(f"{where}.fallback must be a list of model names")
    prices = {}
    for key in ("input_usd_per_mtok", "output_usd_per_mtok"):
        value = raw.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or value < 0
        ):
            raise ConfigurationError(f"{where}.{key} must be a number >= 0")
        prices[key] = None if value is None else float(value)
    options = raw.get("options", {})
    if not isinstance(options, dict) or set(options) - _OPTION_KEYS[kind]:
        raise ConfigurationError(
            f"{where}.options: provider {kind} takes {sorted(_OPTION_KEYS[kind])}"
        )
    _check_options(where, options)
    if kind == "simulated":  # cheap to make: its option values are checked now, not per job
        from .simulated import SimulatedProvider

        try:
            SimulatedProvider(**options)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"{where}.options: {exc}") from None
    for key in ("upstream", "api_key_env"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise ConfigurationError(f"{where}.{key} must be a string")
    return ModelRoute(
        name=name,
        provider=kind,
        upstream=raw.get("upstream") or name,
        base_url=base_url,
        api_key_env=raw.get("api_key_env"),
        max_concurrent=limit,
        fallback=tuple(fallback),
        options=dict(options),
        **prices,
    )


_OPTION_TYPES: dict[str, str] = {
    "timeout_s": "seconds",
    "connect_timeout_s": "seconds",
    "read_timeout_s": "seconds",
    "max_connections": "count",
    "context_tokens": "count",
    "threads": "count",
    "temperature": "number",
    "model_path": "text",
    "stream_usage": "flag",
}


def _check_options(where: str, options: dict[str, Any]) -> None:
    """Option values of the openai and local providers, checked at load (the simulator checks
    its own)."""
    for key, value in options.items():
        kind = _OPTION_TYPES.get(key)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if key == "headers":
            ok = isinstance(value, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            )
            expected = "a table of strings"
        elif kind == "seconds":
            ok, expected = number and 0 < value < float("inf"), "a number of seconds > 0"
        elif kind == "count":
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            expected = "an integer >= 1"
        elif kind == "number":
            ok, expected = number and 0 <= value <= 2, "a number in 0..2"
        elif kind == "text":
            ok, expected = isinstance(value, str) and bool(value), "a non-empty string"
        elif kind == "flag":
            ok, expected = isinstance(value, bool), "true or false"
        else:
            continue
        if not ok:
            raise ConfigurationError(f"{where}.options.{key} must be {expected}, got {value!r}")


def load_config(source: str) -> dict[str, Any]:
    """A routing config from a TOML or JSON file path, or inline JSON (``{...}``)."""
    return load_file(source, what="models", variable="BACKBURNER_MODELS")


class ModelRouter:
    """The routes, and one provider per route made on first use (close with ``aclose``)."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        config = dict(config or {})
        unknown = set(config) - {"default_model", "models"}
        if unknown:
            raise ConfigurationError(f"the models config has unknown keys {sorted(unknown)}")
        raw_models = config.get("models", {})
        if not isinstance(raw_models, dict):
            raise ConfigurationError("models must be a table of model names")
        routes = {"simulated": ModelRoute("simulated", "simulated", "simulated")}
        if local_available():
            routes["local"] = ModelRoute("local", "local", "gemma-3-270m", max_concurrent=None)
        routes.update({name: _route(name, raw) for name, raw in raw_models.items()})
        for route in routes.values():
            for name in route.fallback:
                if name not in routes or name == route.name:
                    raise ConfigurationError(
                        f"models.{route.name}.fallback names {name!r}, which is not another model"
                    )
        self.routes = routes
        default = config.get("default_model")
        if default is not None and not isinstance(default, str):
            raise ConfigurationError("default_model must be a model name")
        self.default_model: str = default or "simulated"
        self.default_is_set = False
        """True once a file, a setting or ``set_default`` chose the default model."""
        if default is not None:
            self.set_default(default)
        self._providers: dict[str, Provider] = {}

    def set_default(self, model: str) -> None:
        """Make ``model`` the default (ConfigurationError if no route has that name)."""
        if model not in self.routes:
            known = ", ".join(sorted(self.routes))
            raise ConfigurationError(f"default model {model!r} is not configured (known: {known})")
        self.default_model = model
        self.default_is_set = True

    @classmethod
    def from_source(cls, source: str | None) -> ModelRouter:
        """From ``BACKBURNER_MODELS``: a file path, inline JSON, or None for the built-ins."""
        return cls(load_config(source) if source else None)

    def route(self, model: str | None) -> ModelRoute:
        """The route of ``model`` (the default model for None); ModelNotFoundError if none."""
        name = model or self.default_model
        route = self.routes.get(name)
        if route is None:
            hint = f"; the local model needs {INSTALL_HINT}" if name == "local" else ""
            raise ModelNotFoundError(
                f"no model {name!r} is configured (known: {', '.join(sorted(self.routes))}){hint}"
            )
        return route

    def chain(self, model: str | None) -> list[ModelRoute]:
        """The route of ``model`` followed by its fallbacks, in order."""
        first = self.route(model)
        return [first, *(self.routes[name] for name in first.fallback)]

    def provider(self, route: ModelRoute) -> Provider:
        """The provider serving ``route``, made on first use."""
        provider = self._providers.get(route.name)
        if provider is None:
            provider = self._providers[route.name] = _make_provider(route)
        return provider

    async def aclose(self) -> None:
        providers, self._providers = list(self._providers.values()), {}
        for provider in providers:
            await provider.aclose()


def _is_http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:  # (an unclosed [IPv6 literal)
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def _make_provider(route: ModelRoute) -> Provider:
    options = dict(route.options)
    if route.provider == "simulated":
        from .simulated import SimulatedProvider

        return SimulatedProvider(**options)
    if route.provider == "local":
        from .local import LocalProvider

        return LocalProvider(max_concurrent=route.max_concurrent or 1, **options)
    from .openai import OpenAIProvider

    key = None
    if route.api_key_env:
        # (A key read from a file or a secret mount often ends in a newline.)
        key = (os.environ.get(route.api_key_env) or "").strip()
        if not key:
            raise ProviderAuthError(
                f"model {route.name!r}: its API key variable {route.api_key_env} is unset"
            )
    assert route.base_url is not None
    return OpenAIProvider(route.base_url, api_key=key, **options)
