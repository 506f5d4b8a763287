"""The ``vllm`` engines: ``vllm``, an in-process ``vllm.LLM`` colocated with the trainer
(:mod:`agentrl_vllm_engine.engine`), and ``vllm_server``, a separate ``vllm serve`` process
(:mod:`agentrl_vllm_engine.server`). vLLM is imported only when an engine is built."""

from __future__ import annotations

from typing import Any

from agentrl import hookimpl
from agentrl_vllm_engine.engine import VLLMEngine
from agentrl_vllm_engine.server import VLLMServerEngine


@hookimpl
def agentrl_register_engines(register: Any) -> None:
    """Register ``vllm`` (in-process) and ``vllm_server`` (a separate ``vllm serve``)."""
    register("vllm", VLLMEngine)
    register("vllm_server", VLLMServerEngine)
