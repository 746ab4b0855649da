"""Per-tenant limits and fair-share weights: ``TenantPolicies`` from the ``tenants`` setting.

The config is a TOML (or JSON) file, or inline JSON::

    [defaults]                      # every tenant without a table of its own
    max_in_flight = 5               # jobs queued + processing; beyond: 429 with Retry-After
    submissions_per_minute = 600    # a bucket of this many, refilled continuously
    weight = 1                      # fair share of the workers within a priority
    max_prompt_chars = 100000       # (default: the service's max_prompt_chars)
    max_tokens = 4096               # (default: the service's max_tokens_limit)
    max_priority = 0                # highest priority it may ask for (-100..100; default: 100)

    [tenants.acme]
    max_in_flight = 50
    weight = 3

A limit set to ``0`` in a tenant's table means no limit (but ``max_priority``, where 0 is a
priority). The tenant ``default`` (library calls and the keyless API) has no in-flight, rate
or priority limit unless it has a table of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .backends.base import DEFAULT_TENANT, Quota, check_tenant, fair_cost
from .configfile import load_config
from .errors import ConfigurationError, InvalidInputError

PRIORITY_MIN = -100
PRIORITY_MAX = 100
DEFAULT_MAX_IN_FLIGHT = 5
DEFAULT_SUBMISSIONS_PER_MINUTE = 600


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """One tenant's limits (None: no limit) and weight."""

    max_in_flight: int | None = DEFAULT_MAX_IN_FLIGHT
    submissions_per_minute: int | None = DEFAULT_SUBMISSIONS_PER_MINUTE
    weight: float = 1.0
    max_prompt_chars: int | None = None
    """Longest prompt of a generation (None: the service's ``max_prompt_chars``)."""
    max_tokens: int | None = None
    """Largest max_tokens of a generation (None: the service's ``max_tokens_limit``)."""
    max_priority: int | None = None
    """Highest priority its jobs may ask for (None: any, up to 100). Priority comes before
    fair share, so a tenant free to pick 100 could go ahead of every other tenant's work."""

    fair_cost: int = field(init=False, repr=False, compare=False)
    """What one job of this tenant costs in fair scheduling (``fair_cost(weight)``), worked out
    once: every enqueue reads it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "fair_cost", fair_cost(self.weight))

    def quota(self) -> Quota | None:
        if self.max_in_flight is None and self.submissions_per_minute is None:
            return None
        return Quota(max_in_flight=self.max_in_flight, per_minute=self.submissions_per_minute)


UNLIMITED = TenantPolicy(max_in_flight=None, submissions_per_minute=None)
_KEYS = {f.name for f in fields(TenantPolicy) if f.init}


def _policy(where: str, raw: Any, base: TenantPolicy) -> TenantPolicy:
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{where} must be a table")
    unknown = set(raw) - _KEYS
    if unknown:
        raise ConfigurationError(
            f"{where} has unknown keys {sorted(unknown)} (known: {', '.join(sorted(_KEYS))})"
        )
    changes: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "weight":
            try:
                fair_cost(value)
            except InvalidInputError as exc:
                raise ConfigurationError(f"{where}.weight: {exc}") from None
            changes[key] = float(value)
        elif key == "max_priority":  # (a priority: 0 is one, not "no limit")
            number = isinstance(value, int) and not isinstance(value, bool)
            if not number or not PRIORITY_MIN <= value <= PRIORITY_MAX:
                raise ConfigurationError(
                    f"{where}.max_priority must be an integer from {PRIORITY_MIN} to"
                    f" {PRIORITY_MAX}, got {value!r}"
                )
            changes[key] = value
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigurationError(f"{where}.{key} must be an integer >= 0, got {value!r}")
        else:
            changes[key] = value or None  # 0: no limit
    return replace(base, **changes)


class TenantPolicies:
    """The policy of every tenant: its own table, else the defaults."""

    def __init__(
        self,
        defaults: TenantPolicy | None = None,
        tenants: Mapping[str, TenantPolicy] | None = None,
    ) -> None:
        self.defaults = defaults or TenantPolicy()
        self._tenants = dict(tenants or {})
        self._tenants.setdefault(DEFAULT_TENANT, replace(self.defaults, **_no_limits()))

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TenantPolicies:
        unknown = set(config) - {"defaults", "tenants"}
        if unknown:
            raise ConfigurationError(
                f"the tenants config has unknown tables {sorted(unknown)}"
                " (known: defaults, tenants)"
            )
        defaults = _policy("defaults", config.get("defaults", {}), TenantPolicy())
        tenants_raw = config.get("tenants", {})
        if not isinstance(tenants_raw, Mapping):
            raise ConfigurationError("tenants must be a table of tables")
        tenants: dict[str, TenantPolicy] = {}
        for name, raw in tenants_raw.items():
            try:
                check_tenant(name)
            except InvalidInputError as exc:
                raise ConfigurationError(f"tenants.{name}: {exc}") from None
            tenants[name] = _policy(f"tenants.{name}", raw, defaults)
        return cls(defaults, tenants)

    @classmethod
    def from_source(cls, source: str | None) -> TenantPolicies:
        """From the ``tenants`` setting (None: built-in defaults)."""
        if source is None:
            return cls()
        return cls.from_config(load_config(source, what="tenants", variable="BACKBURNER_TENANTS"))

    def policy(self, tenant: str) -> TenantPolicy:
        return self._tenants.get(tenant, self.defaults)

    def check_priority(self, tenant: str, priority: int, *, asked: bool) -> int:
        """The priority a job of ``tenant`` gets: ``priority`` within the tenant's
        ``max_priority``. One the caller ``asked`` for above it is refused
        (InvalidInputError); a task's own default above it is lowered to it."""
        cap = self.policy(tenant).max_priority
        if cap is None or priority <= cap:
            return priority
        if asked:
            raise InvalidInputError(
                f"priority {priority} is above the highest this tenant may ask for ({cap})"
            )
        return cap


def _no_limits() -> dict[str, Any]:
    return {"max_in_flight": None, "submissions_per_minute": None, "max_priority": None}
