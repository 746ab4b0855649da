"""What an eviction policy puts at risk, read from ``INFO memory``."""

from __future__ import annotations

import pytest

from backburner.backends.redis_eviction import (
    AT_RISK_ANY,
    AT_RISK_WITH_TTL,
    eviction_risk,
    info_field,
)

INFO = (
    "# Memory\r\nused_memory:1336056\r\nmaxmemory:0\r\nmaxmemory_policy:{}\r\nmem_allocator:x\r\n"
)


@pytest.mark.parametrize(
    ("policy", "risk"),
    [
        ("noeviction", None),
        ("volatile-lru", AT_RISK_WITH_TTL),
        ("volatile-lfu", AT_RISK_WITH_TTL),
        ("volatile-random", AT_RISK_WITH_TTL),
        ("volatile-ttl", AT_RISK_WITH_TTL),
        ("allkeys-lru", AT_RISK_ANY),
        ("allkeys-lfu", AT_RISK_ANY),
        ("allkeys-random", AT_RISK_ANY),
    ],
)
def test_each_policy_read_from_info_names_what_it_may_evict(policy: str, risk: str | None) -> None:
    assert info_field(INFO.format(policy), "maxmemory_policy") == policy
    assert eviction_risk(policy) == risk


def test_info_without_a_policy_reads_as_none() -> None:
    assert info_field("# Memory\r\nused_memory:1\r\n", "maxmemory_policy") is None
    assert info_field("", "maxmemory_policy") is None
    assert info_field(INFO.format("noeviction"), "maxmemory") == "0"
