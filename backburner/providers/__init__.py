"""LLM providers behind one Protocol, the routing of model names, and ``ctx.llm``.

``openai`` (any OpenAI-compatible server), ``local`` (llama.cpp, ``backburner[local]``) and
``simulated`` (a simulator for tests and demos, not a model).
"""

from .base import GenerationRequest, Message, Provider, Usage
from .job_llm import Generation, JobLLM
from .routing import ModelRoute, ModelRouter
from .simulated import SimulatedProvider

__all__ = [
    "Generation",
    "GenerationRequest",
    "JobLLM",
    "Message",
    "ModelRoute",
    "ModelRouter",
    "Provider",
    "SimulatedProvider",
    "Usage",
]
