"""An incremental parser for ``text/event-stream`` (the WHATWG server-sent events format).

Feed it the bytes of a response as they arrive, in chunks of any size; it returns the events
completed so far. It knows nothing about backburner: the clients turn ``data`` into events.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One dispatched event: its type (``message`` by default), data, and last event id."""

    event: str
    data: str
    id: str | None


class SSEParser:
    """Turns chunks of an event stream into ``ServerSentEvent`` objects.

    Lines may end in CRLF, LF or CR, and a chunk may end anywhere, even inside a UTF-8
    character or between the CR and LF of one line ending. Comments (``: keep-alive``) are
    skipped; ``retry:`` sets ``retry_ms``; an event still incomplete when the stream ends is
    dropped, as the format requires.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial: list[str] = []
        """The pieces of the line under way: a long line (a large event's data) arriving in
        many chunks is joined once, at its end (rescanning all of it at every chunk took 10 s
        for one 8 MB event)."""
        self._pending_cr = False  # the last chunk ended in CR: skip an LF that starts the next
        self._started = False
        self._event = ""
        self._data: list[str] = []
        self.last_event_id: str | None = None
        """The id of the last event seen (it carries over events without an ``id:`` field)."""
        self.retry_ms: int | None = None
        """The reconnection time the server asked for, in milliseconds."""

    def feed(self, chunk: bytes | str) -> list[ServerSentEvent]:
        """Parse the next chunk; return the events it completed (often none, or several)."""
        text = chunk if isinstance(chunk, str) else self._decoder.decode(chunk)
        if not text:
            return []
        if not self._started:
            self._started = True
            text = text.removeprefix("\ufeff")
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]
        self._pending_cr = False
        events: list[ServerSentEvent] = []
        start = 0
        for match in _LINE_END.finditer(text):
            if match.group() == "\r" and match.end() == len(text):
                self._pending_cr = True
            line = text[start : match.start()]
            if self._partial:
                self._partial.append(line)
                line = "".join(self._partial)
                self._partial = []
            event = self._line(line)
            if event is not None:
                events.append(event)
            start = match.end()
        if start < len(text):
            self._partial.append(text[start:])
        return events

    def _line(self, line: str) -> ServerSentEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self.last_event_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return ServerSentEvent(event or "message", "\n".join(data), self.last_event_id)
