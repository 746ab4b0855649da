"""What a Sentinel's announcement says of a service (backends/redis_sentinel.py): the words of
Redis 7's messages, as a failover of three Sentinels and two replicas published them."""

from __future__ import annotations

from backburner.backends.redis_sentinel import (
    _ABORT,
    ABORTED,
    PROMOTED,
    PROMOTING,
    SWITCH,
    announcement,
)

SLAVE = "slave 127.0.0.1:22003 127.0.0.1 22003 @ mym 127.0.0.1 22001"


def test_the_replica_about_to_be_promoted_is_the_new_primary() -> None:
    assert announcement(PROMOTING, SLAVE, "mym") == ("127.0.0.1", 22003)
    assert announcement(PROMOTED, SLAVE, "mym") == ("127.0.0.1", 22003)


def test_a_switch_names_the_new_primary() -> None:
    words = "mym 127.0.0.1 22001 127.0.0.1 22003"
    assert announcement(SWITCH, words, "mym") == ("127.0.0.1", 22003)


def test_an_aborted_failover_is_told_apart() -> None:
    assert ABORTED.endswith("*")
    assert (
        announcement("-failover-abort-slave-timeout", "master mym 10.0.0.5 6379", "mym") is _ABORT
    )


def test_another_services_and_garbled_words_say_nothing() -> None:
    assert announcement(PROMOTING, SLAVE, "other") is None
    assert announcement(SWITCH, "other 127.0.0.1 1 127.0.0.1 2", "mym") is None
    assert announcement("-failover-abort-not-elected", "master other 10.0.0.5 6379", "mym") is None
    assert announcement(SWITCH, "mym 127.0.0.1", "mym") is None
    assert announcement(PROMOTED, "slave x 127.0.0.1 notaport @ mym 1 2", "mym") is None
    assert announcement("+sdown", SLAVE, "mym") is None
