"""The hf engine's packed linear layers: oneDNN's pre-reordered weights give ``F.linear``'s outputs bit
for bit, the engine samples the same tokens and logprobs with them as without, a weight sync packs
again (a stale pack would sample from the old weights), and only the engine's own copies are packed;
the fp32 copy of rounded weights samples the same tokens, its logprobs to float rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agentrl import SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.testing import build_tiny_model
from agentrl_hf_engine import HFEngine
from agentrl_hf_engine.packed_linear import PackedLinear, can_pack, pack_linears

ONEDNN = torch.backends.mkldnn.is_available()
BF16_ONEDNN = ONEDNN and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
needs_bf16_onednn = pytest.mark.skipif(not BF16_ONEDNN, reason="oneDNN computes no bf16 on this CPU (no AVX512)")


def tiny() -> torch.nn.Module:
    """A tiny random Llama with a tied LM head, as SmolLM2's."""
    return build_tiny_model(97)


def engine(model: torch.nn.Module, **engine_args: object) -> HFEngine:
    return HFEngine(model, config=TrainConfig(engine_args={"dtype": "bfloat16", **engine_args}))


PROMPTS = [[1, 5, 6, 7], [1, 9], [1, 3, 4, 5, 6, 7, 8, 9, 10, 11], [2, 40, 41], [1, 5, 6, 7]]
SAMPLING = SamplingParams(max_new_tokens=16, temperature=1.0, prompt_seeds=(0, 1, 2, 3, 4))


def samples(eng: HFEngine) -> list[tuple[list[int], list[float]]]:
    return [(g.token_ids, g.logprobs) for g in eng.generate(PROMPTS, SAMPLING)]


@needs_bf16_onednn
@pytest.mark.parametrize("features,outputs", [(576, 1536), (1536, 576), (576, 192), (64, 4097)])
@pytest.mark.parametrize("bias", [False, True])
def test_outputs_are_f_linear_bit_for_bit(features: int, outputs: int, bias: bool) -> None:
    generator = torch.Generator().manual_seed(features + outputs)
    layer = torch.nn.Linear(features, outputs, bias=bias, dtype=torch.bfloat16).requires_grad_(False)
    layer.weight.copy_(torch.randn(outputs, features, generator=generator) * 0.05)
    plain = torch.nn.Linear(features, outputs, bias=bias, dtype=torch.bfloat16).requires_grad_(False)
    plain.load_state_dict(layer.state_dict())
    assert pack_linears(layer) == 1 and isinstance(layer, PackedLinear) and layer.packed is not None
    for rows in (1, 2, 5, 6, 17, 32, 33, 64, 300):
        for shape in ((rows, features), (rows, 1, features), (1, rows, features)):
            x = torch.randn(*shape, generator=generator).to(torch.bfloat16)
            assert torch.equal(layer(x), plain(x)), (rows, shape)
    wide = torch.randn(4, 2 * features, generator=generator).to(torch.bfloat16)[:, ::2]  # not contiguous
    assert torch.equal(layer(wide), plain(wide))


@needs_bf16_onednn
def test_gradients_and_other_dtypes_take_f_linear() -> None:
    layer = torch.nn.Linear(8, 4, dtype=torch.bfloat16)
    reference = torch.nn.Linear(8, 4, dtype=torch.bfloat16)
    reference.load_state_dict(layer.state_dict())
    pack_linears(layer)
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    layer(x).float().square().sum().backward()  # the weight wants gradients: F.linear, so they flow
    reference(x).float().square().sum().backward()
    assert torch.equal(layer.weight.grad, reference.weight.grad)
    x32 = torch.randn(3, 8)
    with torch.no_grad():
        with pytest.raises(RuntimeError, match="dtype"):  # as F.linear refuses fp32 input on bf16 weights
            layer(x32)


def test_only_plain_linears_of_the_engines_own_copies_are_packed() -> None:
    class Lora(torch.nn.Linear):
        """A subclass with a forward of its own (as LoRA layers have)."""

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Lora(4, 4)).to(torch.bfloat16)
    if BF16_ONEDNN:
        assert pack_linears(model) == 1 and type(model[1]) is Lora
    assert not can_pack(torch.nn.Linear(4, 4))  # fp32: MKL's sums, which oneDNN rounds otherwise
    assert can_pack(torch.nn.Linear(4, 4), float32=True) == ONEDNN  # a copy that need not be bit-equal
    trainer_model = tiny()
    exact = HFEngine(trainer_model, config=TrainConfig(engine_args={"dtype": "float32"}))
    assert not any(isinstance(m, PackedLinear) for m in exact.model.modules())  # the trainer's own model
    rounded = HFEngine(trainer_model, config=TrainConfig(engine_args={"dtype": "bfloat16_weights"}))
    assert any(isinstance(m, PackedLinear) for m in rounded.model.modules()) == ONEDNN
    packed = engine(trainer_model)
    assert any(isinstance(m, PackedLinear) for m in packed.model.modules()) == BF16_ONEDNN
    assert not any(isinstance(m, PackedLinear) for m in engine(trainer_model, packed_weights=False).model.modules())
    assert not any(isinstance(m, PackedLinear) for m in trainer_model.modules())  # never the trainer's model


def across_a_sync(model: torch.nn.Module, packed: HFEngine, plain: HFEngine, same) -> tuple[list, list]:
    """``same(packed's samples, plain's)`` before and after a weight change synced to both; then the
    samples of ``packed`` with its old packs put back (what a sync that did not pack again would
    sample) and its samples after the sync."""
    same(samples(packed), samples(plain))
    with torch.no_grad():  # a training step's change, the tied head included
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    stale = {name: m.packed for name, m in packed.model.named_modules() if isinstance(m, PackedLinear)}
    packed.sync_weights(model)
    plain.sync_weights(model)
    after = samples(packed)
    same(after, samples(plain))
    for name, module in packed.model.named_modules():
        if name in stale:
            module.packed = stale[name]
    return samples(packed), after


@needs_bf16_onednn
def test_engine_samples_as_unpacked_before_and_after_a_weight_sync() -> None:
    model = tiny()

    def same(a: list, b: list) -> None:
        assert a == b

    stale, after = across_a_sync(model, engine(model), engine(model, packed_weights=False), same)
    assert [lp for _, lp in stale] != [lp for _, lp in after]


@needs_bf16_onednn
def test_a_weight_changed_since_packing_is_never_served_stale() -> None:
    import copy

    layer = torch.nn.Linear(16, 8, dtype=torch.bfloat16).requires_grad_(False)
    pack_linears(layer)
    x = torch.randn(5, 16, dtype=torch.bfloat16)
    layer.weight.add_(1.0)  # in place, not packed again: the version counter moved
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    clone = copy.deepcopy(layer)  # a copy carries no packed weight
    assert clone.packed is None and torch.equal(clone(x), F.linear(x, layer.weight, layer.bias))
    wider = layer.float()  # another dtype: F.linear on the new fp32 weight
    assert torch.equal(wider(x.float()), F.linear(x.float(), wider.weight, wider.bias))


def rounded(model: torch.nn.Module, **engine_args: object) -> HFEngine:
    return HFEngine(model, config=TrainConfig(engine_args={"dtype": "bfloat16_weights", **engine_args}))


@pytest.mark.skipif(not ONEDNN, reason="torch built without oneDNN")
def test_the_rounded_fp32_copy_packed_samples_the_unpacked_tokens_with_logprobs_to_rounding() -> None:
    model = tiny()
    packed, plain = rounded(model), rounded(model, packed_weights=False)
    assert not packed._own_head and plain._own_head  # the packed LM head replaces the W @ h path

    def close(a: list, b: list) -> None:
        assert [tokens for tokens, _ in a] == [tokens for tokens, _ in b]
        differences = [abs(x - y) for (_, la), (_, lb) in zip(a, b) for x, y in zip(la, lb)]
        assert max(differences) <= 1e-4, max(differences)  # oneDNN's sums against MKL's: last bits

    stale, after = across_a_sync(model, packed, plain, close)
    assert max(abs(x - y) for (_, la), (_, lb) in zip(stale, after) for x, y in zip(la, lb)) > 1e-3
