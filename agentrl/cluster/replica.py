"""One engine replica, the body of a Ray actor (:class:`EngineReplica`), and the weights it is sent
(:func:`pack_weights` / :func:`unpack_weights`).

A replica builds the run's engine on its node the way a one-host run does (the plugins, the
config's model and tokenizer, the registry's engine factory), lazily: its first call builds it, so
an actor that Ray restarts after a crash builds it again by itself. Weights arrive as one object in
Ray's object store: each tensor's bytes as a flat ``uint8`` array (read back without a copy on the
replica's node), tied tensors once.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
import torch

from agentrl.config.train import TrainConfig
from agentrl.sampling.engine import Engine, Generation, SamplingParams

Packed = dict[str, Any]
"""``tensors``: name -> (dtype name, shape, uint8 bytes); ``aliases``: name -> the name holding its tensor."""


def pack_weights(model: torch.nn.Module) -> Packed:
    """``model``'s state dict as plain arrays for ``ray.put`` (a tensor tied under two names, once)."""
    tensors: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
    aliases: dict[str, str] = {}
    first: dict[tuple[Any, ...], str] = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach()
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))
        if tensor.numel() and key in first:
            aliases[name] = first[key]
            continue
        first[key] = name
        flat = tensor.to("cpu").contiguous().reshape(-1).view(torch.uint8)
        tensors[name] = (str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), flat.numpy())
    return {"tensors": tensors, "aliases": aliases}


def unpack_weights(packed: Packed) -> dict[str, torch.Tensor]:
    """The state dict :func:`pack_weights` packed (tensors viewing the arrays' memory, read-only)."""
    state: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():  # the object store's arrays are read-only; load_state_dict copies them
        warnings.simplefilter("ignore", UserWarning)
        for name, (dtype, shape, data) in packed["tensors"].items():
            state[name] = torch.from_numpy(data).view(getattr(torch, dtype)).reshape(shape)
    for name, source in packed["aliases"].items():
        state[name] = state[source]
    return state


def packed_bytes(packed: Packed) -> int:
    """How many bytes of weights :func:`pack_weights` packed."""
    return sum(int(data.nbytes) for _, _, data in packed["tensors"].values())


class EngineReplica:
    """The run's engine in a Ray actor (``ray.remote(EngineReplica)``), with its own copy of the model.

    ``plugins``: ``(disabled, modules)`` as the CLI's ``--disable-plugin`` / ``--plugin`` gave them."""

    def __init__(self, config: TrainConfig, plugins: tuple[list[str], list[str]] = ([], [])) -> None:
        self.config, self.plugins = config, plugins
        self.model: torch.nn.Module | None = None
        self.engine: Engine | None = None
        self.loaded: str | None = None  # the object ref (hex) of the weights loaded

    def node(self) -> tuple[str, int]:
        """Where this replica runs: its node id and pid (a new pid: Ray restarted it); builds nothing."""
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def build(self) -> tuple[tuple[str, int], str]:
        """Build the engine (once): plugins, model, tokenizer, the registry's factory; its description."""
        return self.node(), self._engine().description

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, weights: list[Any]
    ) -> tuple[tuple[str, int], list[Generation]]:
        """The engine's generations of ``prompts`` from the weights of ``weights[0]`` (an object ref,
        loaded first unless this replica holds them: a replica Ray restarted starts from the config's)."""
        self.load_weights(weights)
        return self.node(), self._engine().generate(prompts, sampling)

    def load_weights(self, weights: list[Any]) -> tuple[tuple[str, int], None]:
        """Load the weights of ``weights[0]`` (an object ref to :func:`pack_weights`' output, or None:
        none sent yet) into the model, then into the engine, unless they are loaded already."""
        import ray

        engine = self._engine()
        ref = weights[0]
        if ref is not None and ref.hex() != self.loaded:
            assert self.model is not None
            self.model.load_state_dict(unpack_weights(ray.get(ref)))
            engine.sync_weights(self.model)
            self.loaded = ref.hex()
        return self.node(), None

    def state_dict(self) -> tuple[tuple[str, int], dict[str, Any]]:
        """The engine's state (its generator...)."""
        return self.node(), self._engine().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> tuple[tuple[str, int], None]:
        """Restore :meth:`state_dict`'s output."""
        self._engine().load_state_dict(state)
        return self.node(), None

    def _engine(self) -> Engine:
        if self.engine is None:
            from agentrl.model.loading import load_model, load_tokenizer
            from agentrl.plugins import load_plugins

            disabled, modules = self.plugins
            manager = load_plugins(disabled=disabled, modules=modules)
            tokenizer = load_tokenizer(self.config.model)
            self.model = load_model(self.config.model)
            factory = manager.registry.get("engine", self.config.engine).factory
            self.engine = factory(model=self.model, tokenizer=tokenizer, config=self.config)
        return self.engine


def plugin_choice(manager: Any) -> tuple[list[str], list[str]]:
    """The ``(disabled, modules)`` that make a manager like ``manager`` (None: every installed
    plugin): installed entry points it lacks, plugins it loaded by import path or file."""
    if manager is None:
        return [], []
    import importlib.metadata

    from agentrl.plugins import ENTRY_POINT_GROUP

    installed = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    disabled = sorted(installed - set(manager.plugins))
    modules = [name for name, info in manager.plugins.items() if info.distribution is None and name not in installed]
    return disabled, [name for name in modules if name != "agentrl.defaults"]
