"""A simulated LLM: deterministic text at a set pace. Not a model; for demos and tests."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

_WORDS = [
    "the",
    "answer",
    "depends",
    "on",
    "the",
    "question",
    "and",
    "on",
    "what",
    "the",
    "context",
    "says",
    "about",
    "it",
    "so",
    "this",
    "simulated",
    "model",
    "writes",
    "plausible",
    "filler",
    "one",
    "token",
    "at",
    "a",
    "time",
    "until",
    "it",
    "reaches",
    "its",
    "limit",
]


@dataclass(frozen=True, slots=True)
class SimulatedProvider:
    """Streams made-up words; the same prompt always gives the same text."""

    name: str = "simulated"
    time_to_first_token_s: float = 0.05
    tokens_per_s: float = 50.0

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    async def stream(self, prompt: str, *, max_tokens: int) -> AsyncIterator[str]:
        """Yield up to ``max_tokens`` text deltas (each a word with its leading space)."""
        seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big")
        await asyncio.sleep(self.time_to_first_token_s)
        for i in range(max_tokens):
            if i:
                await asyncio.sleep(1 / self.tokens_per_s)
            word = _WORDS[(seed + i * 7) % len(_WORDS)]
            yield word if i == 0 else " " + word
