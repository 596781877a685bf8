"""FP8 e4m3 weights with 128 x 128 block scales (DeepSeek-V3 / GLM-5 checkpoints) and the GEMM that
runs them.

The GEMM kernel is chosen per weight shape by a probe on the device: the first candidate that runs
and matches a float32 emulation of the block-scaled product wins, and its name is recorded.
On CUDA the probe runs in a child process (`probe_in_child`), never in the process that measures,
and every blockwise launch first passes `block_layout_error` (cuBLAS's scale layout), so a layout
cuBLAS would read out of bounds is refused instead of launched.
Candidates, in order: torch `scaled_mm` (then `torch._scaled_mm`) with 1x128 activation / 128x128
weight block scales (what SGLang runs on SM90, via DeepGEMM or its Triton w8a8 kernel); `torch._scaled_mm` rowwise (same FP8
weight bytes, per-row/per-column scales: numerics differ from the block recipe, bytes do not); and
BF16 (the weight dequantized once: twice the weight bytes — the CPU fallback).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from harness.tpot.config import BLOCK

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


def _round_up(v: int, to: int) -> int:
    return -(-v // to) * to


def padded_block_scales(w: FP8Weight) -> torch.Tensor:
    """fp32 [ceil(N/128), round_up(K/128, 4)]: the weight's block scales with the K-blocks padded to a
    multiple of 4 (zeros), the layout cuBLASLt reads for 128x128 block scaling. Unpadded, cuBLAS reads
    past the tensor whenever (K/128) % 4 != 0 (GLM-5 TP8's shared-expert down_proj: K = 256, 2 blocks)."""
    nb, kb = w.scale.shape
    kb4 = _round_up(kb, 4)
    if kb4 == kb:
        return w.scale.contiguous()
    out = torch.zeros((nb, kb4), dtype=w.scale.dtype, device=w.scale.device)
    out[:, :kb] = w.scale
    return out


def block_layout_error(m: int, k: int, n: int, scale_a: torch.Tensor, scale_b: torch.Tensor) -> str | None:
    """cuBLASLt's scale layout for 1x128 (activations, [M, K]) x 128x128 (weight, [K, N]) block scaling
    (cuBLAS docs, "scaling factors layouts"; PyTorch #166752): scale_a [M, K/128] stride (1, M);
    scale_b [round_up(K/128, 4), N/128] stride (1, round_up(K/128, 4)). This harness also pads M to a
    multiple of 4 (16-byte aligned scale columns). None when the layout is one cuBLAS reads in bounds."""
    kb, nb = -(-k // BLOCK), -(-n // BLOCK)
    kb4 = _round_up(kb, 4)
    if m % 4:
        return f"M = {m} is not a multiple of 4 (pad the activation rows)"
    if tuple(scale_a.shape) != (m, kb) or (kb > 1 and scale_a.stride() != (1, m)):
        return f"scale_a {tuple(scale_a.shape)} stride {scale_a.stride()}: want ({m}, {kb}) stride (1, {m})"
    if tuple(scale_b.shape) != (kb4, nb) or (nb > 1 and scale_b.stride() != (1, kb4)):
        return f"scale_b {tuple(scale_b.shape)} stride {scale_b.stride()}: want ({kb4}, {nb}) stride (1, {kb4}) (K-blocks padded to 4)"
    return None


def _blockwise_with(legacy: bool = False) -> Callable:
    """1x128 activation and 128x128 weight block scales through torch's `scaled_mm` (or, `legacy`,
    `torch._scaled_mm`, which infers the recipe from the scale shapes). Every launch goes through
    `block_layout_error` first: a layout cuBLAS would read out of bounds raises ValueError instead
    of launching (an out-of-bounds read is an illegal-address fault that poisons the CUDA context).
    Activation rows are padded to a multiple of 4. The legacy entry point can't take padded K-blocks
    (its check wants exactly K/128), so for (K/128) % 4 != 0 it refuses without launching."""

    def make(w: FP8Weight) -> Callable:
        import torch.nn.functional as F

        n, k = w.q.shape
        scale_b = padded_block_scales(w).t()  # [round_up(K/128, 4), N/128], stride (1, round_up(K/128, 4))
        if legacy and scale_b.shape[0] != -(-k // BLOCK):
            def refuse(x):
                raise ValueError(f"torch._scaled_mm can't take K-blocks padded to 4 (K = {k})")
            return refuse

        def run(x):
            m = x.shape[0]
            m4 = _round_up(m, 4)
            xp = x if m4 == m else torch.cat([x, x.new_zeros((m4 - m, k))])
            xq, xs = quantize_groups(xp)
            xs = xs.t().contiguous().t()  # 1x128 scales must be outer-dim-major
            err = block_layout_error(m4, k, n, xs, scale_b)
            if err:
                raise ValueError(f"blockwise scaled_mm layout: {err}")
            if legacy:
                out = torch._scaled_mm(xq, w.q.t(), scale_a=xs, scale_b=scale_b, out_dtype=torch.bfloat16)
            else:
                out = F.scaled_mm(xq, w.q.t(), xs, F.ScalingType.BlockWise1x128, scale_b, F.ScalingType.BlockWise128x128,
                                  output_dtype=torch.bfloat16)
            return out if m4 == m else out[:m]

        return run

    return make


_blockwise_t = _blockwise_with()
_blockwise_legacy = _blockwise_with(legacy=True)


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


# "scaled_mm_blockwise" (the weight scales untransposed) is gone: no torch build accepts that layout
CANDIDATES = {"scaled_mm_blockwise_t": _blockwise_t, "_scaled_mm_blockwise": _blockwise_legacy,
              "scaled_mm_rowwise": _rowwise, "bf16": _bf16}
SAFE = ("scaled_mm_rowwise", "bf16")  # the fallback set when a probe child dies


def _probe_ok(w: FP8Weight, make, batch: int) -> bool:
    """Does the kernel `make(w)` run at this shape and agree with the float32 emulation?
    On CUDA, call it only in a child process (`probe_in_child`): a kernel that faults poisons the
    whole CUDA context of the process that launched it."""
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


_CHILD_CHOICES: dict = {}  # (shapes, batch, device) -> {shape: kernel name}: one probe child per process and batch


def _probe_here(shapes, batch: int, device: str, names) -> dict:
    """In THIS process: the first candidate of `names` that passes the probe, per (N, K) shape."""
    out = {}
    for n, k in shapes:
        gen = torch.Generator(device="cpu").manual_seed(n * 7 + k)
        q, scale = quantize_blocks((torch.randn((n, k), generator=gen) * k ** -0.5).to(device))
        w = FP8Weight(q, scale)
        out[(n, k)] = next(c for c in names if c == "bf16" or _probe_ok(w, CANDIDATES[c], batch))
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()  # a fault surfaces here, in the child, not in the caller
    return out


def probe_in_child(shapes, batch: int, device, names=tuple(CANDIDATES)) -> tuple[dict, str]:
    """({(N, K): kernel}, note): the probe of every shape run in a child Python process, so a kernel
    that faults can't poison the measuring process's CUDA context. A child that dies is retried with
    the SAFE candidates only; the note says which happened."""
    import json
    import subprocess
    import sys

    from harness.errors import HarnessError

    shapes = tuple(sorted(set(shapes)))
    key = (shapes, batch, str(device), tuple(names))
    if key in _CHILD_CHOICES:
        return _CHILD_CHOICES[key]
    tried = []
    for pick in (tuple(names), tuple(n for n in names if n in SAFE)):
        spec = json.dumps({"shapes": shapes, "batch": batch, "device": str(device), "names": pick})
        proc = subprocess.run([sys.executable, "-m", "harness.tpot.fp8", spec], capture_output=True, text=True, timeout=300)
        if proc.returncode == 0:
            got = {tuple(s): name for s, name in json.loads(proc.stdout.strip().splitlines()[-1])}
            note = "probed in a child process" + (f"; first child died ({tried[0]}), SAFE candidates only" if tried else "")
            _CHILD_CHOICES[key] = (got, note)
            return got, note
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        tried.append(f"rc {proc.returncode}: {tail}")
    raise HarnessError("FP8 GEMM probe", f"every probe child died: {' | '.join(tried)}")


def bind_kernel(w: FP8Weight, batch: int, cache: dict) -> None:
    """Pick the GEMM for `w` (CPU: bf16; CUDA: the first candidate that passes the probe), cached by shape."""
    key = (tuple(w.q.shape), batch, w.q.device.type)
    if key not in cache:
        names = ["bf16"] if w.q.device.type != "cuda" else list(CANDIDATES)
        cache[key] = next(n for n in names if n == "bf16" or _probe_ok(w, CANDIDATES[n], batch))
    bind_named(w, cache[key])


def bind_named(w: FP8Weight, name: str) -> None:
    w.kernel = name
    w.run = CANDIDATES[name](w)


def bind_kernels(weights, batch: int) -> str:
    """Bind every weight's GEMM. CPU: bf16. CUDA: kernels chosen by `probe_in_child` (no probe kernel
    runs in this process). Returns a note on how they were chosen."""
    weights = list(weights)
    if not weights or weights[0].q.device.type != "cuda":
        for w in weights:
            bind_named(w, "bf16")
        return "cpu: bf16"
    chosen, note = probe_in_child([tuple(w.q.shape) for w in weights], batch, weights[0].q.device)
    for w in weights:
        bind_named(w, chosen[tuple(w.q.shape)])
    return note


if __name__ == "__main__":  # the probe child: python -m harness.tpot.fp8 '{"shapes": ..., "batch": ..., ...}'
    import json
    import sys

    spec = json.loads(sys.argv[1])
    picked = _probe_here([tuple(s) for s in spec["shapes"]], spec["batch"], spec["device"], spec["names"])
    print(json.dumps([[list(s), name] for s, name in picked.items()]))
