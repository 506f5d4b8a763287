"""``precision: auto``: bf16 only where the hardware computes bf16 natively, fp32 elsewhere.

bf16 autocast pays on a CPU with native bf16 matrix instructions (Intel AMX, AVX512-BF16; the
Arm ``bf16`` extension) and on GPUs that support it. On a CPU without them (AVX2 only: most
laptops, Intel consumer CPUs since Alder Lake, AMD before Zen 4) oneDNN emulates bf16 and the
same forward + backward ran ~30x slower than fp32 (docs/benchmarks/hardware.md: 12.3 + 140 s against 3.3 + 4.3 s on
8 x 92 tokens of the default model); on a Xeon with AVX-512 but not its BF16 extension, 3.6x
slower. The decision is made once per run from what the hardware reports and printed in the
banner with its reason; ``bf16`` and ``fp32`` are honoured as given.
"""

from __future__ import annotations

import contextlib
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

PRECISIONS = ("auto", "bf16", "fp32")
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")  # x86 (Linux /proc/cpuinfo names); Arm "bf16"


@dataclass(frozen=True)
class Precision:
    """The precision a run computes in (``bf16`` or ``fp32``) and why it was chosen."""

    name: str
    reason: str

    @property
    def bf16(self) -> bool:
        """Whether forward passes run under bf16 autocast (and the hf engine samples in bf16)."""
        return self.name == "bf16"

    def autocast(self, device: torch.device) -> torch.autocast:
        """The context forward passes on ``device`` run in: bf16 autocast when the run computes in
        bf16 (fp32 master weights), else a disabled one (nothing changes)."""
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def casts_kept(self, device: torch.device) -> contextlib.AbstractContextManager[object]:
        """A context in which the bf16 copies autocast makes of the weights are kept until it exits:
        the forwards of several micro-batches inside it cast each weight once instead of once each
        (autocast drops its cache only on leaving its outermost context; this one computes nothing
        in bf16 itself). For unsharded weights only: sharded ones are gathered anew by every forward."""
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=False)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    """The CPU's feature flags as the kernel lists them (``flags`` on x86, ``Features`` on Arm),
    or None where there is no ``/proc/cpuinfo`` (macOS, Windows)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def decide_cpu(flags: set[str] | None) -> Precision:
    """``auto`` on a CPU with these feature flags (None: unknown, e.g. not Linux): bf16 when one of
    :data:`NATIVE_BF16_FLAGS` is present, fp32 otherwise."""
    if flags is None:
        return Precision("fp32", f"CPU features unknown on {platform.system() or 'this OS'}: fp32 is the safe choice")
    native = sorted(f for f in NATIVE_BF16_FLAGS if f in flags)
    if native:
        return Precision("bf16", f"the CPU computes bf16 natively ({', '.join(native)})")
    return Precision(
        "fp32", "the CPU has no native bf16 (no amx_bf16/avx512_bf16): bf16 would be emulated, 3.6-30x slower"
    )


def resolve_precision(asked: str, device: torch.device | str = "cpu") -> Precision:
    """The precision a run with ``precision: asked`` computes in on ``device``.

    ``bf16``/``fp32`` are taken as given; ``auto`` asks the hardware: a CUDA device's own
    bf16 support, a CPU's feature flags (:func:`cpu_flags`, decided by :func:`decide_cpu`).
    """
    if asked not in PRECISIONS:
        from agentrl.errors import ConfigError

        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {asked!r}")
    if asked != "auto":
        return Precision(asked, "set in the config")
    kind = torch.device(device).type
    if kind == "cuda":
        if torch.cuda.is_bf16_supported():
            return Precision("bf16", f"{torch.cuda.get_device_name()} supports bf16")
        return Precision("fp32", f"{torch.cuda.get_device_name()} has no bf16 support")
    if kind != "cpu":
        return Precision("fp32", f"bf16 support on {kind} is not checked: fp32 is the safe choice")
    return decide_cpu(cpu_flags())
