"""Events read back from a Redis stream (redis_codec.decode_events): a damaged entry is a
CorruptRecordError naming its job and entry, which the API answers as 500 corrupt_record (it
was a JSONDecodeError: a 500 internal_error with a traceback, or a stream cut off)."""

from __future__ import annotations

import pytest

from backburner.backends.redis_codec import decode_events
from backburner.errors import CorruptRecordError


def test_entries_are_read_back() -> None:
    (event,) = decode_events("task_a", [[b"3-0", [b"t", b"log", b"d", b'{"x":1}', b"a", b"2.5"]]])
    assert (event.seq, event.type, event.data, event.at) == (3, "log", {"x": 1}, 2.5)


@pytest.mark.parametrize(
    "flat",
    [
        [b"t", b"log", b"d", b"{bad", b"a", b"2.5"],
        [b"t", b"log", b"a", b"2.5"],
        [b"t", b"log", b"d", b"1", b"a", b"soon"],
        [b"t", b"\xff", b"d", b"1", b"a", b"2.5"],
    ],
    ids=["data", "missing", "time", "type"],
)
def test_a_damaged_entry_names_its_job_and_entry(flat: list[bytes]) -> None:
    with pytest.raises(CorruptRecordError, match=r"job task_a: .*event 3-0"):
        decode_events("task_a", [[b"3-0", flat]])
