"""FP8 e4m3 weights with 128 x 128 block scales (DeepSeek-V3 / GLM-5 checkpoints) and the GEMM that
runs them.

The GEMM kernel is chosen per weight shape by a probe on the device: the first candidate that runs
and matches a float32 emulation of the block-scaled product wins, and its name is recorded.
Candidates, in order: torch `scaled_mm` (then `torch._scaled_mm`) with 1x128 activation / 128x128
weight block scales (what SGLang runs on SM90, via DeepGEMM or its Triton w8a8 kernel); `torch._scaled_mm` rowwise (same FP8
weight bytes, per-row/per-column scales: numerics differ from the block recipe, bytes do not); and
BF16 (the weight dequantized once: twice the weight bytes — the CPU fallback).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from harness.model.config import BLOCK

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def quantize_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 [N, K], fp32 scales [ceil(N/128), K/128]) of a float weight, per 128 x 128 block."""
    n, k = w.shape
    n_pad = -(-n // BLOCK) * BLOCK
    padded = torch.zeros((n_pad, k), dtype=torch.float32, device=w.device)
    padded[:n] = w
    tiles = padded.view(n_pad // BLOCK, BLOCK, k // BLOCK, BLOCK)
    scale = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    q = (tiles / scale[:, None, :, None]).to(FP8).view(n_pad, k)[:n].contiguous()
    return q, scale


def dequantize_blocks(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 [N, K] of a block-quantized weight."""
    n, k = q.shape
    full = scale.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)
    return q.float() * full


def quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 [M, K], fp32 scales [M, K/128]) per 1 x 128 activation group (SGLang's
    per_token_group_quant_fp8)."""
    m, k = x.shape
    groups = x.float().view(m, k // BLOCK, BLOCK)
    scale = groups.abs().amax(dim=2).clamp(min=1e-12) / FP8_MAX
    return (groups / scale[..., None]).to(FP8).view(m, k), scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 [M, K], fp32 scales [M, 1]) per row."""
    scale = x.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return (x.float() / scale).to(FP8), scale


@dataclass
class FP8Weight:
    """A block-quantized weight [N, K] and the GEMM kernel that multiplies activations by it."""

    q: torch.Tensor  # fp8 [N, K]
    scale: torch.Tensor  # fp32 [ceil(N/128), K/128]
    kernel: str = "unset"
    run: Callable[[torch.Tensor], torch.Tensor] | None = None

    @property
    def nbytes_read(self) -> int:
        """Bytes one GEMM reads of this weight under its kernel (BF16 fallback: the dequantized copy)."""
        elems = self.q.numel()
        return elems * 2 if self.kernel == "bf16" else elems + self.scale.numel() * 4

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x)


def _blockwise_with(scale_b_of: Callable[[torch.Tensor], torch.Tensor], legacy: bool = False) -> Callable:
    """1x128 activation and 128x128 weight block scales through torch's `scaled_mm` (or, `legacy`,
    `torch._scaled_mm`, which infers the recipe from the scale shapes); `scale_b_of` lays the
    [N/128, K/128] weight scales out the way the torch build asks (as is, or transposed)."""

    def make(w: FP8Weight) -> Callable:
        import torch.nn.functional as F

        scale_b = scale_b_of(w.scale)

        def run(x):
            xq, xs = quantize_groups(x)
            xs = xs.t().contiguous().t()  # 1x128 scales must be outer-dim-major
            if legacy:
                return torch._scaled_mm(xq, w.q.t(), scale_a=xs, scale_b=scale_b, out_dtype=torch.bfloat16)
            return F.scaled_mm(xq, w.q.t(), xs, F.ScalingType.BlockWise1x128, scale_b, F.ScalingType.BlockWise128x128,
                               output_dtype=torch.bfloat16)

        return run

    return make


_blockwise = _blockwise_with(lambda s: s)
_blockwise_t = _blockwise_with(lambda s: s.t())
_blockwise_legacy = _blockwise_with(lambda s: s.t(), legacy=True)


def _column_scales(w: FP8Weight) -> torch.Tensor:
    """fp32 [1, N]: per output channel, the largest block scale of its row of blocks."""
    return w.scale.amax(dim=1).repeat_interleave(BLOCK)[: w.q.shape[0]].view(1, -1).contiguous()


def _rowwise(w: FP8Weight) -> Callable:
    col_scale = _column_scales(w)

    def run(x):
        xq, xs = quantize_rows(x)
        return torch._scaled_mm(xq, w.q.t(), scale_a=xs, scale_b=col_scale, out_dtype=torch.bfloat16)

    return run


def _bf16(w: FP8Weight) -> Callable:
    dense = dequantize_blocks(w.q, w.scale).to(torch.bfloat16)

    def run(x):
        return x @ dense.t()

    return run


CANDIDATES = {"scaled_mm_blockwise": _blockwise, "scaled_mm_blockwise_t": _blockwise_t,
              "_scaled_mm_blockwise": _blockwise_legacy, "scaled_mm_rowwise": _rowwise, "bf16": _bf16}


def _probe_ok(w: FP8Weight, make, batch: int) -> bool:
    """Does the kernel `make(w)` run at this shape and agree with the float32 emulation?"""
    gen = torch.Generator(device="cpu").manual_seed(7)
    x = torch.randn((batch, w.q.shape[1]), generator=gen).to(device=w.q.device, dtype=torch.bfloat16)
    try:
        got = make(w)(x).float()
    except (RuntimeError, NotImplementedError, ValueError, TypeError, AttributeError):
        return False
    dense = w.q.float() * _column_scales(w).t() if make is _rowwise else dequantize_blocks(w.q, w.scale)
    want = x.float() @ dense.t()
    if got.shape != want.shape:
        return False
    err = (got - want).norm() / want.norm().clamp(min=1e-12)
    return bool(err < 0.08)


def bind_kernel(w: FP8Weight, batch: int, cache: dict) -> None:
    """Pick the GEMM for `w` (CPU: bf16; CUDA: the first candidate that passes the probe), cached by shape."""
    key = (tuple(w.q.shape), batch, w.q.device.type)
    if key not in cache:
        names = ["bf16"] if w.q.device.type != "cuda" else list(CANDIDATES)
        cache[key] = next(n for n in names if n == "bf16" or _probe_ok(w, CANDIDATES[n], batch))
    w.kernel = cache[key]
    w.run = CANDIDATES[w.kernel](w)
