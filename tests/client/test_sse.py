"""The event-stream parser: any chunking of a stream gives the same events."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from backburner.client import sse
from backburner.client.sse import ServerSentEvent, SSEParser

STREAM = (
    "\ufeffretry: 1000\r\n\r\n"
    ": keep-alive\n\n"
    'id: 1\nevent: status\ndata: {"a": 1}\n\n'
    "id: 2\revent: token\rdata: caf\u00e9 \u2603\r\r"
    "data: first\ndata:second\ndata\n\n"
    "id: 3\r\nevent: token\r\ndata:  two spaces\r\n\r\n"
    "event: ignored-without-data\n\n"
    "id: 4\ndata: never finished"
)
EXPECTED = [
    ServerSentEvent("status", '{"a": 1}', "1"),
    ServerSentEvent("token", "caf\u00e9 \u2603", "2"),
    ServerSentEvent("message", "first\nsecond\n", "2"),
    ServerSentEvent("token", " two spaces", "3"),
]


def parse(chunks: list[bytes]) -> tuple[list[ServerSentEvent], SSEParser]:
    parser = SSEParser()
    events: list[ServerSentEvent] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return events, parser


def test_whole_stream() -> None:
    events, parser = parse([STREAM.encode()])
    assert events == EXPECTED
    assert parser.retry_ms == 1000
    assert parser.last_event_id == "4"  # set even though its event never completed


def test_every_split_point_gives_the_same_events() -> None:
    raw = STREAM.encode()
    for cut in range(len(raw) + 1):
        assert parse([raw[:cut], raw[cut:]])[0] == EXPECTED, cut


def test_byte_by_byte() -> None:
    raw = STREAM.encode()
    assert parse([raw[i : i + 1] for i in range(len(raw))])[0] == EXPECTED


def test_cr_then_lf_in_the_next_chunk_is_one_line_end() -> None:
    events, _ = parse([b"data: x\r", b"\n", b"\r", b"\n"])
    assert events == [ServerSentEvent("message", "x", None)]


def test_bad_retry_and_id_with_nul_are_ignored() -> None:
    events, parser = parse([b"retry: soon\nid: a\x00b\ndata: y\n\n"])
    assert parser.retry_ms is None
    assert events == [ServerSentEvent("message", "y", None)]


def test_str_chunks() -> None:
    assert SSEParser().feed("data: z\n\n") == [ServerSentEvent("message", "z", None)]


def test_a_large_event_in_many_chunks_is_parsed_in_linear_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The whole line under way was rescanned at every chunk: one 8 MB event fed in 16 KiB
    # pieces took 10 s (2 MB: 0.7 s). Counted, not timed: the characters scanned for line ends.
    scanned = 0
    line_end = sse._LINE_END

    class Counting:
        def finditer(self, text: str) -> Iterator[re.Match[str]]:
            nonlocal scanned
            scanned += len(text)
            return line_end.finditer(text)

    monkeypatch.setattr(sse, "_LINE_END", Counting())
    data = "x" * (4 * 1024 * 1024)
    stream = f"id: 7\nevent: completed\ndata: {data}\n\n".encode()
    parser = SSEParser()
    events = []
    for i in range(0, len(stream), 16 * 1024):
        events += parser.feed(stream[i : i + 16 * 1024])
    assert events == [ServerSentEvent("completed", data, "7")]
    assert scanned == len(stream)  # (was about 128 times that)


def test_a_line_split_across_chunks_keeps_its_pieces_in_order() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: ab") == []
    assert parser.feed(b"cd") == []
    assert parser.feed(b"ef\r") == []
    assert parser.feed(b"\n\r\n") == [ServerSentEvent("message", "abcdef", None)]
