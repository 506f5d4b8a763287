"""The trained modules' AdamW: fused where it applies, the same arithmetic as torch's default, and
a checkpoint of either implementation loads into the other."""

from __future__ import annotations

import copy

import torch

from agentrl.rundir.state_schema import optimizer_problem
from agentrl.training.optimizers import adamw, load_optimizer_state

SETTINGS = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)


def _params(seed: int) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in [(7, 5), (5,), (3, 4, 2)]]


def _steps(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()


def test_fused_on_whole_cpu_weights_and_the_default_when_sharded():
    assert adamw(_params(0), sharded=False, **SETTINGS).param_groups[0]["fused"] is True
    assert not adamw(_params(0), sharded=True, **SETTINGS).param_groups[0]["fused"]


def test_fused_steps_equal_the_default_implementation_to_rounding():
    fused_params, plain_params = _params(0), _params(0)
    fused = adamw(fused_params, sharded=False, **SETTINGS)
    plain = torch.optim.AdamW(plain_params, **SETTINGS)
    _steps(fused, fused_params, 5, seed=1)
    _steps(plain, plain_params, 5, seed=1)
    for a, b, start in zip(fused_params, plain_params, _params(0)):
        assert (a - start).abs().max() > 1e-3  # they moved
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_checkpoint_of_either_implementation_loads_into_the_other_and_keeps_its_own():
    plain_params = _params(0)
    plain = torch.optim.AdamW(plain_params, **SETTINGS)
    _steps(plain, plain_params, 3, seed=1)
    saved = copy.deepcopy(plain.state_dict())  # as read from disk: not the live moments
    fused_params = [torch.nn.Parameter(p.detach().clone()) for p in plain_params]
    fused = adamw(fused_params, sharded=False, **SETTINGS)
    assert optimizer_problem(saved, fused, "optimizers.pt key 'policy'") is None
    load_optimizer_state(fused, saved)
    assert fused.param_groups[0]["fused"] is True  # its own implementation, not the saved run's
    _steps(fused, fused_params, 2, seed=2)
    _steps(plain, plain_params, 2, seed=2)
    for a, b in zip(fused_params, plain_params):  # the moments came over: the same trajectory
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    back = torch.optim.AdamW([torch.nn.Parameter(p.detach().clone()) for p in fused_params], **SETTINGS)
    assert optimizer_problem(fused.state_dict(), back, "optimizers.pt key 'policy'") is None
