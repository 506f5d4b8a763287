"""``precision: auto``: bf16 only on hardware that computes it natively, decided from the CPU flags."""

from __future__ import annotations

import contextlib

import pytest
import torch

from agentrl.config.train import TrainConfig
from agentrl.errors import ConfigError
from agentrl.model.precision import Precision, cpu_flags, decide_cpu, resolve_precision
from agentrl_hf_engine import sampling_dtype

# Flags as /proc/cpuinfo lists them, cut to the relevant ones.
AVX2_ONLY = {"fpu", "sse4_2", "avx", "avx2", "fma", "f16c"}  # AMD Zen 3, Intel Alder Lake
AVX512_BF16 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512_bf16"}  # AMD Zen 4, Cooper Lake
AMX = AVX512_BF16 | {"amx_bf16", "amx_tile", "amx_int8"}  # Sapphire Rapids
AVX512_NO_BF16 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512_vnni"}  # Skylake/Cascade Lake server


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (AVX2_ONLY, "fp32"),
        (AVX512_NO_BF16, "fp32"),
        (AVX512_BF16, "bf16"),
        (AMX, "bf16"),
        ({"fp", "asimd", "bf16"}, "bf16"),
        ({"fp", "asimd"}, "fp32"),
        (None, "fp32"),
    ],
)
def test_auto_decides_from_the_cpu_flags(flags, expected):
    decision = decide_cpu(flags)
    assert decision.name == expected
    assert decision.bf16 == (expected == "bf16")
    if flags == AMX:
        assert "amx_bf16" in decision.reason and "avx512_bf16" in decision.reason
    if flags == AVX2_ONLY:
        assert "no native bf16" in decision.reason


def test_cpu_flags_reads_the_x86_and_arm_lines(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\nflags\t\t: fpu avx2 amx_bf16\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert cpu_flags(x86) == {"fpu", "avx2", "amx_bf16"}
    assert cpu_flags(arm) == {"fp", "asimd", "bf16"}
    assert cpu_flags(tmp_path / "missing") is None


def test_explicit_precision_is_honoured_and_auto_matches_this_cpu():
    assert resolve_precision("bf16").name == "bf16" and resolve_precision("fp32").name == "fp32"
    assert resolve_precision("auto", "cpu") == decide_cpu(cpu_flags())
    with pytest.raises(ConfigError, match="precision must be one of auto, bf16, fp32, got 'fp16'"):
        resolve_precision("fp16")


def test_auto_is_the_default_and_the_hf_engine_follows_it():
    assert TrainConfig().precision == "auto"
    assert sampling_dtype("bfloat16", "fp32", "cpu") == "bfloat16"  # explicit engine dtype wins
    assert sampling_dtype("float32", "bf16", "cpu") == "float32"
    assert sampling_dtype("auto", "bf16", "cpu") == "bfloat16"
    assert sampling_dtype("auto", "fp32", "cpu") == "float32"
    native = resolve_precision("auto", "cpu").bf16
    assert sampling_dtype("auto", "auto", "cpu") == ("bfloat16" if native else "bfloat16_weights")
    with pytest.raises(ConfigError, match="precision must be one of"):
        TrainConfig(precision="half")


def _weight_casts(prof, weight: torch.Tensor) -> int:
    """How many dtype casts of a tensor shaped like ``weight`` the profiler saw."""
    return sum(
        1
        for e in prof.events()
        if e.name == "aten::_to_copy" and e.input_shapes and e.input_shapes[0] == list(weight.shape)
    )


@pytest.mark.parametrize("kept", [False, True])
def test_casts_kept_casts_each_weight_once_per_step_and_changes_no_gradient(kept: bool) -> None:
    """Two micro-batches' forwards under bf16 autocast: inside ``casts_kept`` the weight is cast to
    bf16 once (autocast's cache survives the inner contexts), outside once per micro-batch; the
    gradients are the same to the bit."""
    from torch.profiler import ProfilerActivity, profile

    precision = Precision("bf16", "test")
    gradients = []
    for keep in (False, kept):
        torch.manual_seed(0)
        layer = torch.nn.Linear(16, 24)
        batches = [torch.randn(5, 16), torch.randn(7, 16)]
        outer = precision.casts_kept(torch.device("cpu")) if keep else contextlib.nullcontext()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, outer:
            for x in batches:
                with precision.autocast(torch.device("cpu")):
                    y = layer(x)
                y.float().square().sum().backward()
        # forward: fp32 -> bf16 once (kept) or once per micro-batch; backward: each bf16 gradient back to fp32
        assert _weight_casts(prof, layer.weight) == (1 if keep else len(batches)) + len(batches)
        gradients.append((layer.weight.grad.clone(), layer.bias.grad.clone()))
    assert all(torch.equal(a, b) for a, b in zip(*gradients))
    assert isinstance(Precision("fp32", "test").casts_kept(torch.device("cpu")), contextlib.nullcontext)
