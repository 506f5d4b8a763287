"""Sampling from a sharded policy (FSDP, DeepSpeed ZeRO-3): a full-weight replica per process.

Under FSDP or ZeRO-3 no process holds the whole policy, so the engine cannot sample from the
trained object. Each process then keeps one plain replica of the model (made before sharding)
for its engine, and after every update the full weights are gathered from the shards into it
(:func:`gather_into`), a collective every process calls. DDP and ZeRO-2 replicate the weights:
no replica is made and the engine samples from the trained model as on one process.

On a machine without a GPU accelerate would run an FSDP config as plain DDP, silently;
:func:`make_accelerator` keeps it FSDP (PyTorch shards over gloo on a CPU), so the sharded
path is the one tested on a CPU and the config a user names is the one that runs.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch


def make_accelerator() -> Any:
    """The run's ``Accelerator``: on a CPU (gloo) when no GPU is present, FSDP when the launch asked
    for it (``ACCELERATE_USE_FSDP``, set by ``accelerate launch`` from an FSDP config) even on a CPU."""
    from accelerate import Accelerator
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    asked_fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if asked_fsdp and accelerator.distributed_type == DistributedType.MULTI_CPU:
        # accelerate enables FSDP for GPU process groups only; its FSDP preparation runs over gloo too.
        # Set as accelerate sets it on GPUs: the plugin from the launch's env, the type in both states.
        accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin()
        accelerator.state.distributed_type = DistributedType.FSDP
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return accelerator


def shards_weights(accelerator: Any) -> bool:
    """Whether ``accelerator`` splits the model's parameters over processes (FSDP, ZeRO-3)."""
    from accelerate.utils import DistributedType

    kind = accelerator.distributed_type
    if kind == DistributedType.FSDP:
        return True
    if kind == DistributedType.DEEPSPEED:
        return int(accelerator.state.deepspeed_plugin.zero_stage) == 3
    return False


def layout(accelerator: Any) -> str:
    """One line on how the processes hold the policy's weights (printed at start-up)."""
    kind = accelerator.distributed_type.value
    if shards_weights(accelerator):
        return (
            f"{accelerator.num_processes} processes ({kind}): weights sharded; each samples from a full "
            "replica gathered after every update"
        )
    return f"{accelerator.num_processes} processes ({kind}): weights replicated"


def sampling_replica(accelerator: Any, model: torch.nn.Module) -> torch.nn.Module | None:
    """A frozen full copy of ``model`` for the engine when the run shards weights, else None
    (call before ``accelerator.prepare``)."""
    if not shards_weights(accelerator):
        return None
    replica = copy.deepcopy(model).eval()
    for p in replica.parameters():
        p.requires_grad_(False)
    return replica


def full_state_dict(accelerator: Any, prepared: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every entry of the prepared module's state dict, whole, on every process (names as the
    unwrapped module's). A collective: every process calls it."""
    from accelerate.utils import DistributedType

    unwrapped = accelerator.unwrap_model(prepared)
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        import deepspeed

        params = list(unwrapped.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return {k: v.detach().clone() for k, v in unwrapped.state_dict().items()}
    if getattr(accelerator, "is_fsdp2", False):
        from torch.distributed.tensor import DTensor

        return {
            k: (v.full_tensor() if isinstance(v, DTensor) else v).detach() for k, v in unwrapped.state_dict().items()
        }
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    whole = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)
    with FSDP.state_dict_type(prepared, StateDictType.FULL_STATE_DICT, whole):
        return {k: v.detach() for k, v in prepared.state_dict().items()}


def gather_into(accelerator: Any, prepared: torch.nn.Module, replica: torch.nn.Module, prefix: str = "") -> None:
    """Copy the full weights of ``prepared`` (entries under ``prefix``, stripped) into ``replica``."""
    state = {k[len(prefix) :]: v for k, v in full_state_dict(accelerator, prepared).items() if k.startswith(prefix)}
    missing, unexpected = replica.load_state_dict(state, strict=False)
    tied = {name for name, _ in replica.named_parameters(remove_duplicate=False)} - set(
        dict(replica.named_parameters())
    )
    if unexpected or set(missing) - tied:
        raise RuntimeError(
            f"gathered weights do not fit the sampling replica: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )


def shape_template(module: torch.nn.Module) -> torch.nn.Module:
    """A weightless copy of ``module`` (on the meta device) to save its gathered weights into later
    (call before ``accelerator.prepare``: FSDP shards the module in place)."""
    return copy.deepcopy(module).to("meta")


def unsharded(template: torch.nn.Module, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """``template`` (from :func:`shape_template`) holding ``state``, a full state dict, on the CPU."""
    module = template.to_empty(device="cpu")
    module.load_state_dict({k: v.cpu() for k, v in state.items()})
    return module


def whole_optimizer_state(prepared: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """The optimizer state of an FSDP-prepared module, whole and keyed by parameter name, on the
    main process (empty on the others). A collective: every process calls it. Independent of
    the process count, so a checkpoint holds one copy, not one per process."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(
        prepared, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


def whole_module_state(prepared: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of an FSDP-prepared module, whole, on the main process (empty on the others).
    A collective: every process calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(prepared, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_whole_state(
    prepared: torch.nn.Module,
    optimizer: Any,
    module_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any] | None,
) -> None:
    """Shard whole state dicts (from :func:`whole_module_state` and :func:`whole_optimizer_state`,
    read by every process) back into an FSDP-prepared module and its optimizer (``optimizer_state``
    None: a finished run's slimmed checkpoint, the optimizer starts afresh)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

    options = StateDictOptions(full_state_dict=True)
    if optimizer_state is None:
        set_model_state_dict(prepared, module_state, options=options)
    else:
        set_state_dict(
            prepared, optimizer, model_state_dict=module_state, optim_state_dict=optimizer_state, options=options
        )


def is_fsdp(accelerator: Any) -> bool:
    """Whether the run is sharded by FSDP (its checkpoints go through :func:`whole_optimizer_state`)."""
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.FSDP
