"""Iterative GRPO's reference reset (DeepSeekMath, arXiv 2402.03300, Algorithm 1: "reference model
pi_ref <- pi_theta" at the start of every iteration of M steps).

With ``algorithm.ref_sync_every: M`` (> 0, clipped-policy algorithms with ``beta > 0``) the frozen
reference is moved towards the policy after every M-th step:

    ref <- ref_sync_mix * ref + (1 - ref_sync_mix) * policy      (mix 0: a plain copy)

computed in float64 per tensor and rounded once to the reference's dtype, so the result is a
function of the two tensors alone (a resume recomputes nothing: the reference's weights are saved
in every checkpoint written after the first reset, :data:`REFERENCE_FILE`). Steps M+1..2M then
take their KL to the policy as it was after step M. The policy's weights are those the engine
samples from (:meth:`agentrl.training.learner.Learner.sampling_model`: the model itself, or under FSDP /
ZeRO-3 the whole replica). With LoRA the reference is the policy with its adapter off, not a copy: a
reset has nothing to write to, and is refused at start-up.
"""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.errors import CheckpointError
from agentrl.rundir.state_files import load_tensors, save_tensors

REFERENCE_FILE = "reference.pt"
"""The reference's state dict inside a checkpoint, written once a reset has happened."""


def reset_due(step: int, every: int) -> bool:
    """Whether the reference is reset after ``step`` (1-based) with ``ref_sync_every=every`` (0: never)."""
    return every > 0 and step % every == 0


def has_been_reset(step: int, every: int) -> bool:
    """Whether a reset happened at or before ``step``: the reference then differs from the base model."""
    return every > 0 and step >= every


@torch.no_grad()
def mix_into(reference: torch.nn.Module, policy: torch.nn.Module, mix: float) -> None:
    """``reference <- mix * reference + (1 - mix) * policy`` for every parameter and buffer, in
    float64 rounded once to the reference's dtype (mix 0: an exact copy). Both are the same
    architecture; tied tensors are visited once."""
    theirs = dict(policy.named_parameters()) | dict(policy.named_buffers())
    ours = dict(reference.named_parameters()) | dict(reference.named_buffers())
    if ours.keys() != theirs.keys():
        missing = sorted(ours.keys() ^ theirs.keys())[:3]
        raise ValueError(
            f"the reference and the policy differ in their tensors ({missing}): cannot reset the reference"
        )
    for name, ref in ours.items():
        source = theirs[name].detach().to(ref.device)
        if mix == 0 or not torch.is_floating_point(ref):
            ref.copy_(source)
        else:
            ref.copy_((mix * ref.double() + (1 - mix) * source.double()).to(ref.dtype))


def save_reference(reference: torch.nn.Module, folder: Path) -> None:
    """The reference's state dict (CPU tensors) in ``folder`` (a checkpoint being written)."""
    save_tensors({k: v.detach().cpu() for k, v in reference.state_dict().items()}, folder / REFERENCE_FILE)


def load_reference(reference: torch.nn.Module, folder: Path, needed: bool) -> None:
    """Restore the reference from checkpoint ``folder`` when it holds one; ``needed`` (a reset
    happened before the checkpoint's step) with no file is a CheckpointError."""
    path = folder / REFERENCE_FILE
    if not path.is_file():
        if needed:
            raise CheckpointError(
                f"checkpoint {str(folder)!r} holds no {REFERENCE_FILE} although the reference was "
                "reset before it (algorithm.ref_sync_every): resume from a checkpoint written with "
                "ref_sync_every, or set ref_sync_every to 0"
            )
        return
    reference.load_state_dict(load_tensors(path))
