"""LLM providers. Today: a simulator; real ones (OpenAI-compatible, llama.cpp) come next."""

from .simulated import SimulatedProvider

__all__ = ["SimulatedProvider"]
