"""Fused FP8 absorbed-MLA decode: split-KV (flash-decoding) straight from the e4m3 pool.

Stage 1: program (request b, split s, head block g) walks its share of b's token-level
kv_indices BLOCK_N rows at a time, loads each pool row (512 latent + 64 RoPE e4m3 codes)
once for all BLOCK_H heads, dequantizes it in registers (the hardware e4m3 -> bf16 convert,
exact), and does the two dots of absorbed MLA with the heads as the M dimension:
logits = q_nope . ckv + q_pe . kpe and acc += P . ckv (V is the latent ckv itself), with an
online softmax in fp32. P enters the P.V dot either as two bf16 parts (hi + lo: 16
significant bits where FlashInfer rounds it to bf16's 8) or, with V converted to fp16
(exact for e4m3), as fp16 (11 bits). How a tile is loaded (once and transposed, twice, or
one tile ahead), the tile size and the split count are a `Config`, tuned per shape
(harness/kernels/fused_tuning.py); Config.tokens_m swaps the roles (the tile's tokens as the M,
so that sm_90 uses wgmma: _stage1_tokm). It writes the split's normalized output (fp32) and base-2 LSE. Stage 2 merges the splits
of each request: out bf16 [B, H, 512] and natural-log LSE fp32 [B, H]. With one split,
stage 1 writes the final output directly and stage 2 is not launched.

A per-tensor `kv_scale` (SGLang's k_scale, 1.0 for its unscaled pool) scales logits and
output. NaN codes (0x7F/0xFF) turn into NaN on the GPU and propagate to the output and
LSE (the Triton interpreter converts them to +-480 instead). CUDA-graph capturable: the
grid depends only on the batch size and the plan's split count; lengths and indices are
read on the device, so a plan's buffers can be refilled in place between replays.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from harness.envvars import triton_interpreted
from harness.kernels import fused_mla_cuda
from harness.kernels.cast import e4m3_to_bf16

STAGE2_WARPS = 4
STAGE2_BLOCK_D = 128  # stage 2 programs per (request, head block): 512 / 128 channel chunks
P_SPLIT = True  # P enters the P.V dot as hi + lo bf16 parts
# The Triton interpreter keeps bf16 as uint16 bits and its tl.dot multiplies those bits, and
# its fp32 -> bf16 cast truncates: under TRITON_INTERPRET=1 the dots take the same bf16 values
# upcast to fp32 (exact) and the roundings are done on the bits (INTERPRETER=True).
INTERPRETED = triton_interpreted(os.environ.get("TRITON_INTERPRET"))
BLOCK_H = 16  # heads per program: the M of the tensor-core dot (mma needs >= 16)
LN2 = math.log(2.0)


@dataclass(frozen=True)
class Config:
    """Launch configuration of one plan: KV splits per request and the stage-1 tile."""

    num_splits: int
    block_n: int = 32
    num_warps: int = 4
    num_stages: int = 2
    reload_v: bool = False  # load each KV tile twice (K^T for QK, V for P.V) instead of transposing
    pv_fp16: bool = False  # the P.V dot in fp16 (P 11 bits) instead of bf16 hi + lo parts
    prefetch: bool = False  # load the next tile's rows before working on this one (not with reload_v)
    # The split kernel (_stage1_split, used when any of these is off its default): V's 512
    # columns shared out over dv_split programs (each does the whole QK, P.V for its columns,
    # so its accumulator is 512 / dv_split wide); the QK dot over the latent in qk_chunk-wide
    # pieces (0: one dot); contig: a tile whose indices are one run of consecutive rows is
    # loaded from its first row (checked on the device per tile, gathered otherwise).
    dv_split: int = 1
    qk_chunk: int = 0
    contig: bool = False
    # tokens_m (_stage1_tokm): the tile's tokens as the M of both dots (logits^T = K . Q^T,
    # acc^T += V^T . P^T), so that sm_90 compiles them to wgmma (M >= 64: block_n 64 or 128);
    # K and V^T are separate (cp.async-pipelined) loads of the tile's rows, in 128-column parts.
    tokens_m: bool = False
    # cuda: the CUDA kernel (harness/kernels/fused_mla_cuda.cu): 64-token tiles, 8 or 16 warps,
    # fp16 P.V, a num_stages-deep shared-memory ring of cp.async gathers; needs sm_89+ and a CUDA
    # torch. Its splits are merged by the last CTA of each request, or with pdl_merge by a second
    # kernel, a programmatic dependent launch on sm_90+ (cheaper at many splits per request), or with
    # cluster_merge (sm_90+, 2, 4 or 8 splits) by the request's CTAs as one thread-block cluster,
    # through distributed shared memory (no partials in global memory, no second kernel); requests
    # past one wave of clusters run beside it, merged by their last CTA (fused_mla_cuda.wave_split); or
    # with grid_merge by all of the request's CTAs at once, each a slice of the channels, once all have
    # arrived (a launch of one wave whose splits divide 128; else the last-CTA merge: fused_mla_cuda.grid_merges).
    cuda: bool = False
    pdl_merge: bool = False
    cluster_merge: bool = False
    grid_merge: bool = False
    # ping_pong (CUDA, 16 warps, 2 stages): two groups of 8 warps each stream every other tile of the
    # split through their own ring, with their own softmax state, merged in shared memory at the end
    # (two tiles worked on at once without a second split).
    ping_pong: bool = False

    def __post_init__(self):
        if self.prefetch and self.reload_v:
            raise ValueError("prefetch and reload_v are two ways of loading a tile: pick one")
        if self.dv_split not in (1, 2, 4) or self.qk_chunk not in (0, 64, 128, 256):
            raise ValueError(f"dv_split must be 1, 2 or 4 and qk_chunk 0, 64, 128 or 256, got {self}")
        if self.split_kernel and (self.prefetch or self.reload_v):
            raise ValueError("the split kernel loads K^T and V separately: prefetch and reload_v do not apply")
        if self.tokens_m and (self.split_kernel or self.prefetch or self.reload_v):
            raise ValueError("tokens_m is its own kernel: dv_split, qk_chunk, contig, prefetch and reload_v do not apply")
        if self.cuda and ((self.block_n, self.pv_fp16) != (64, True)
                          or self.split_kernel or self.prefetch or self.reload_v or self.tokens_m):
            raise ValueError(f"the CUDA kernel has block_n 64 and fp16 P.V, and no Triton options: {self}")
        if (self.pdl_merge or self.cluster_merge or self.grid_merge or self.ping_pong) and not self.cuda:
            raise ValueError(f"pdl_merge, cluster_merge, grid_merge and ping_pong are CUDA kernel options: {self}")
        if self.pdl_merge + self.cluster_merge + self.grid_merge > 1:
            raise ValueError(f"pdl_merge, cluster_merge and grid_merge are ways of merging the splits: pick one: {self}")
        if self.cuda:
            try:
                self.cuda_instance(8)  # the kernel instance's checks: ring depths, warps, ping_pong
            except ValueError as exc:
                raise ValueError(f"{exc}: {self}") from None
        if self.cluster_merge and self.num_splits not in fused_mla_cuda.CLUSTER_SPLITS:
            raise ValueError(f"cluster_merge takes {fused_mla_cuda.CLUSTER_SPLITS} splits (one cluster of them): {self}")

    def cuda_instance(self, num_heads: int) -> fused_mla_cuda.Instance:
        """The CUDA kernel instance this Config launches for `num_heads` query heads."""
        return fused_mla_cuda.Instance(fused_mla_cuda.heads_per_cta(num_heads), self.num_stages, self.num_warps,
                                       self.ping_pong)

    @property
    def merge_by(self) -> str:
        """Who merges a CUDA launch's splits (harness.kernels.fused_mla_cuda.MERGES)."""
        return "cluster" if self.cluster_merge else "kernel" if self.pdl_merge else "grid" if self.grid_merge else "cta"

    @property
    def split_kernel(self) -> bool:
        return self.dv_split > 1 or self.qk_chunk > 0 or self.contig


@triton.jit
def _bf16(x, INTERPRETER: tl.constexpr):
    """fp32 -> bf16 rounded to nearest even (the interpreter's own cast truncates)."""
    if INTERPRETER:
        bits = x.to(tl.uint32, bitcast=True)
        x = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).to(tl.float32, bitcast=True)
    return x.to(tl.bfloat16)


@triton.jit
def _load_rows(ckv, kpe, indices, offs, hi, s_ckv, s_kpe, d, dp):
    """uint8 (ckv [N, 512], kpe [N, 64]) of the rows at positions `offs` (< hi) of `indices`."""
    ok = offs < hi
    row = tl.load(indices + offs, mask=ok, other=0).to(tl.int64)
    c = tl.load(ckv + row[:, None] * s_ckv + d[None, :], mask=ok[:, None], other=0)
    k = tl.load(kpe + row[:, None] * s_kpe + dp[None, :], mask=ok[:, None], other=0)
    return c, k


@triton.jit
def _mac(acc, p, v, TRANS: tl.constexpr):
    """acc + P . V, or with TRANS (tokens as the dot's K, heads as its N) acc + V^T . P."""
    if TRANS:
        acc += tl.dot(v, p)
    else:
        acc += tl.dot(p, v)
    return acc


@triton.jit
def _pv(acc, p, v_u8, P_SPLIT: tl.constexpr, PV_FP16: tl.constexpr, INTERPRETER: tl.constexpr,
        TRANS: tl.constexpr):
    """acc + P . V for one tile, V the e4m3 codes v_u8. With TRANS: acc [cols, BLOCK_H] + V^T . P,
    v_u8 the codes of V^T [cols, BLOCK_N] and p [BLOCK_N, BLOCK_H] (the tokens-as-M kernel)."""
    if PV_FP16:  # P and V in fp16: e4m3 is exact in it, P keeps 11 significant bits
        v = v_u8.to(tl.float8e4nv, bitcast=True).to(tl.float16)
        if INTERPRETER:  # (the interpreter's fp16 cast truncates: P stays fp32 there)
            acc = _mac(acc, p, v.to(tl.float32), TRANS)
        else:
            acc = _mac(acc, p.to(tl.float16), v, TRANS)
    else:
        c = e4m3_to_bf16(v_u8)
        p_hi = _bf16(p, INTERPRETER)
        if INTERPRETER:
            p_hi, c = p_hi.to(tl.float32), c.to(tl.float32)
        acc = _mac(acc, p_hi, c, TRANS)
        if P_SPLIT:  # P as hi + lo bf16 parts: 16 significant bits, not bf16's 8
            p_lo = (p - p_hi.to(tl.float32)).to(tl.bfloat16)
            if INTERPRETER:
                p_lo = p_lo.to(tl.float32)
            acc = _mac(acc, p_lo, c, TRANS)
    return acc


@triton.jit
def _split_range(indptr, b, split, num_splits, BLOCK_N: tl.constexpr):
    """Request b's first index, and the [lo, hi) token range of its split (whole BLOCK_N tiles)."""
    start = tl.load(indptr + b)
    n = tl.load(indptr + b + 1) - start
    per_split = tl.cdiv(tl.cdiv(n, num_splits), BLOCK_N) * BLOCK_N
    lo = split * per_split
    return start, lo, tl.minimum(lo + per_split, n)


@triton.jit
def _program(indptr, num_heads, num_splits, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program (request b, split, head block) of a (batch, splits, head blocks) grid: b, split, its
    heads and their mask, and b's first index and the split's [lo, hi) token range."""
    b = tl.program_id(0)
    split = tl.program_id(1)
    heads = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
    start, lo, hi = _split_range(indptr, b, split, num_splits, BLOCK_N)
    return b, split, heads, heads < num_heads, start, lo, hi


@triton.jit
def _stage1(q_nope, q_pe, ckv, kpe, indptr, indices, part_out, part_lse, out, lse,
            sq_b, sq_h, sqp_b, sqp_h, s_ckv, s_kpe, so_b, so_h, sl_b,
            num_heads, num_splits, qk_scale_log2, v_scale,
            D_CKV: tl.constexpr, D_KPE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
            DIRECT: tl.constexpr, P_SPLIT: tl.constexpr, RELOAD_V: tl.constexpr, PV_FP16: tl.constexpr,
            PREFETCH: tl.constexpr, INTERPRETER: tl.constexpr):
    b, split, heads, h_ok, start, lo, hi = _program(indptr, num_heads, num_splits, BLOCK_H, BLOCK_N)

    d = tl.arange(0, D_CKV)
    dp = tl.arange(0, D_KPE)
    qn = tl.load(q_nope + b.to(tl.int64) * sq_b + heads[:, None] * sq_h + d[None, :], mask=h_ok[:, None], other=0.0)
    qp = tl.load(q_pe + b.to(tl.int64) * sqp_b + heads[:, None] * sqp_h + dp[None, :], mask=h_ok[:, None], other=0.0)
    if INTERPRETER:
        qn, qp = qn.to(tl.float32), qp.to(tl.float32)

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D_CKV], tl.float32)
    if PREFETCH:
        c_next, k_next = _load_rows(ckv, kpe, indices + start, lo + tl.arange(0, BLOCK_N), hi, s_ckv, s_kpe, d, dp)
    for n0 in range(lo, hi, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        ok = offs < hi
        if PREFETCH:  # this tile came in during the last iteration; start the next one now
            c_u8, k_u8 = c_next, k_next
            c_next, k_next = _load_rows(ckv, kpe, indices + start, offs + BLOCK_N, hi, s_ckv, s_kpe, d, dp)
            c_t, k_t = tl.trans(e4m3_to_bf16(c_u8)), tl.trans(e4m3_to_bf16(k_u8))
        elif RELOAD_V:  # K^T loaded in the QK dot's operand order; V loaded again below (a cache hit)
            row = tl.load(indices + start + offs, mask=ok, other=0).to(tl.int64)
            c_t = e4m3_to_bf16(tl.load(ckv + row[None, :] * s_ckv + d[:, None], mask=ok[None, :], other=0))
            k_t = e4m3_to_bf16(tl.load(kpe + row[None, :] * s_kpe + dp[:, None], mask=ok[None, :], other=0))
        else:
            c_u8, k_u8 = _load_rows(ckv, kpe, indices + start, offs, hi, s_ckv, s_kpe, d, dp)
            c_t, k_t = tl.trans(e4m3_to_bf16(c_u8)), tl.trans(e4m3_to_bf16(k_u8))
        if INTERPRETER:  # the same bf16 values, multiplied in fp32
            c_t, k_t = c_t.to(tl.float32), k_t.to(tl.float32)
        qk = tl.dot(qn, c_t) + tl.dot(qp, k_t)
        qk = tl.where(ok[None, :], qk * qk_scale_log2, float("-inf"))
        m_new = tl.maximum(m, tl.max(qk, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        if RELOAD_V:
            c_u8 = tl.load(ckv + row[:, None] * s_ckv + d[None, :], mask=ok[:, None], other=0)
        acc = _pv(acc * alpha[:, None], p, c_u8, P_SPLIT, PV_FP16, INTERPRETER, False)
        m = m_new

    empty = hi <= lo  # no rows: out 0 and LSE -inf (the torch reference's empty softmax)
    l = tl.where(empty, 1.0, l)
    o = tl.where(empty, 0.0, acc / l[:, None] * v_scale)
    lse2 = tl.where(empty, float("-inf"), m + tl.log2(l))
    if DIRECT:
        tl.store(out + b.to(tl.int64) * so_b + heads[:, None] * so_h + d[None, :], _bf16(o, INTERPRETER), mask=h_ok[:, None])
        tl.store(lse + b.to(tl.int64) * sl_b + heads, lse2 * 0.6931471805599453, mask=h_ok)
    else:
        slot = (b.to(tl.int64) * num_splits + split) * num_heads + heads
        tl.store(part_out + slot[:, None] * D_CKV + d[None, :], o, mask=h_ok[:, None])
        tl.store(part_lse + slot, lse2, mask=h_ok)


@triton.jit
def _q_t(q_row, heads, h_ok, cols, s_h, INTERPRETER: tl.constexpr):
    """Q^T [len(cols), BLOCK_H] of one request (the B operand of a tokens-as-M dot)."""
    q = tl.load(q_row + heads[None, :] * s_h + cols[:, None], mask=h_ok[None, :], other=0.0)
    if INTERPRETER:
        q = q.to(tl.float32)
    return q


@triton.jit
def _qk_t(qk, x_u8, q_t, INTERPRETER: tl.constexpr):
    """qk + X . Q^T, X the e4m3 codes x_u8 [BLOCK_N, cols] (converted to bf16, exact)."""
    x = e4m3_to_bf16(x_u8)
    if INTERPRETER:
        x = x.to(tl.float32)
    return qk + tl.dot(x, q_t)


@triton.jit
def _stage1_tokm(q_nope, q_pe, ckv, kpe, indptr, indices, part_out, part_lse, out, lse,
                 sq_b, sq_h, sqp_b, sqp_h, s_ckv, s_kpe, so_b, so_h, sl_b,
                 num_heads, num_splits, qk_scale_log2, v_scale,
                 D_CKV: tl.constexpr, D_KPE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                 DIRECT: tl.constexpr, P_SPLIT: tl.constexpr, PV_FP16: tl.constexpr, INTERPRETER: tl.constexpr):
    """Stage 1 with the tile's tokens as the M of both dots (Config.tokens_m), so that sm_90 can
    use wgmma (M >= 64 per warpgroup) where the heads-as-M kernels use mma.sync:
    logits^T [BLOCK_N, BLOCK_H] = K [BLOCK_N, 576] . Q^T, the online softmax down each head's
    column, and acc^T [512, BLOCK_H] += V^T . P^T. The tile's rows are read twice, in four
    128-column parts each (each part its own dot, so a part's converted operand is the only one
    live in registers; acc^T is four [128, BLOCK_H] accumulators): row-major for K, then
    column-major for V^T, which hits L1 / L2 (one load feeding both dots is not pipelined by
    Triton 3.9 and spills: docs/h200/fused/README.md)."""
    CH: tl.constexpr = D_CKV // 4
    b, split, heads, h_ok, start, lo, hi = _program(indptr, num_heads, num_splits, BLOCK_H, BLOCK_N)

    dc = tl.arange(0, CH)
    dp = tl.arange(0, D_KPE)
    q_row = q_nope + b.to(tl.int64) * sq_b
    q0 = _q_t(q_row, heads, h_ok, dc, sq_h, INTERPRETER)
    q1 = _q_t(q_row, heads, h_ok, CH + dc, sq_h, INTERPRETER)
    q2 = _q_t(q_row, heads, h_ok, 2 * CH + dc, sq_h, INTERPRETER)
    q3 = _q_t(q_row, heads, h_ok, 3 * CH + dc, sq_h, INTERPRETER)
    qp = _q_t(q_pe + b.to(tl.int64) * sqp_b, heads, h_ok, dp, sqp_h, INTERPRETER)

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc0 = tl.zeros([CH, BLOCK_H], tl.float32)
    acc1 = tl.zeros([CH, BLOCK_H], tl.float32)
    acc2 = tl.zeros([CH, BLOCK_H], tl.float32)
    acc3 = tl.zeros([CH, BLOCK_H], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        ok = offs < hi
        row = tl.load(indices + start + offs, mask=ok, other=0).to(tl.int64)
        row_c = row[:, None] * s_ckv
        k = tl.load(kpe + row[:, None] * s_kpe + dp[None, :], mask=ok[:, None], other=0)
        qk = _qk_t(tl.zeros([BLOCK_N, BLOCK_H], tl.float32), k, qp, INTERPRETER)
        qk = _qk_t(qk, tl.load(ckv + row_c + dc[None, :], mask=ok[:, None], other=0), q0, INTERPRETER)
        qk = _qk_t(qk, tl.load(ckv + row_c + (CH + dc)[None, :], mask=ok[:, None], other=0), q1, INTERPRETER)
        qk = _qk_t(qk, tl.load(ckv + row_c + (2 * CH + dc)[None, :], mask=ok[:, None], other=0), q2, INTERPRETER)
        qk = _qk_t(qk, tl.load(ckv + row_c + (3 * CH + dc)[None, :], mask=ok[:, None], other=0), q3, INTERPRETER)
        qk = tl.where(ok[:, None], qk * qk_scale_log2, float("-inf"))
        m_new = tl.maximum(m, tl.max(qk, 0))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(qk - m_new[None, :])
        l = l * alpha + tl.sum(p, 0)
        row_v = row[None, :] * s_ckv  # V^T, the same rows addressed column-major (an L1 / L2 hit)
        acc0 = _pv(acc0 * alpha[None, :], p, tl.load(ckv + row_v + dc[:, None], mask=ok[None, :], other=0),
                   P_SPLIT, PV_FP16, INTERPRETER, True)
        acc1 = _pv(acc1 * alpha[None, :], p, tl.load(ckv + row_v + (CH + dc)[:, None], mask=ok[None, :], other=0),
                   P_SPLIT, PV_FP16, INTERPRETER, True)
        acc2 = _pv(acc2 * alpha[None, :], p, tl.load(ckv + row_v + (2 * CH + dc)[:, None], mask=ok[None, :], other=0),
                   P_SPLIT, PV_FP16, INTERPRETER, True)
        acc3 = _pv(acc3 * alpha[None, :], p, tl.load(ckv + row_v + (3 * CH + dc)[:, None], mask=ok[None, :], other=0),
                   P_SPLIT, PV_FP16, INTERPRETER, True)
        m = m_new

    empty = hi <= lo
    l = tl.where(empty, 1.0, l)
    lse2 = tl.where(empty, float("-inf"), m + tl.log2(l))
    scale = tl.where(empty, 0.0, v_scale / l)
    _store_t(acc0 * scale[None, :], dc, b, split, heads, h_ok, part_out, out, so_b, so_h, num_heads, num_splits, D_CKV, DIRECT, INTERPRETER)
    _store_t(acc1 * scale[None, :], CH + dc, b, split, heads, h_ok, part_out, out, so_b, so_h, num_heads, num_splits, D_CKV, DIRECT, INTERPRETER)
    _store_t(acc2 * scale[None, :], 2 * CH + dc, b, split, heads, h_ok, part_out, out, so_b, so_h, num_heads, num_splits, D_CKV, DIRECT, INTERPRETER)
    _store_t(acc3 * scale[None, :], 3 * CH + dc, b, split, heads, h_ok, part_out, out, so_b, so_h, num_heads, num_splits, D_CKV, DIRECT, INTERPRETER)
    if DIRECT:
        tl.store(lse + b.to(tl.int64) * sl_b + heads, lse2 * 0.6931471805599453, mask=h_ok)
    else:
        tl.store(part_lse + (b.to(tl.int64) * num_splits + split) * num_heads + heads, lse2, mask=h_ok)


@triton.jit
def _store_t(o_t, cols, b, split, heads, h_ok, part_out, out, so_b, so_h, num_heads, num_splits,
             D_CKV: tl.constexpr, DIRECT: tl.constexpr, INTERPRETER: tl.constexpr):
    """Store columns `cols` of a tokens-as-M program's output, held transposed (o_t [len(cols), BLOCK_H])."""
    if DIRECT:
        tl.store(out + b.to(tl.int64) * so_b + heads[None, :] * so_h + cols[:, None], _bf16(o_t, INTERPRETER), mask=h_ok[None, :])
    else:
        slot = (b.to(tl.int64) * num_splits + split) * num_heads + heads
        tl.store(part_out + slot[None, :] * D_CKV + cols[:, None], o_t, mask=h_ok[None, :])


@triton.jit
def _contig_run(idx, full, BLOCK_N: tl.constexpr):
    """(whether a tile's indices are BLOCK_N consecutive pool rows, its first row). Every index
    is compared, not just the two ends; a tile with masked rows (`full` false) is never a run."""
    first = tl.min(idx, 0)
    return full & (tl.max(tl.abs(idx - first - tl.arange(0, BLOCK_N)), 0) == 0), first


@triton.jit
def _stage1_split(q_nope, q_pe, ckv, kpe, indptr, indices, part_out, part_lse, out, lse,
                  sq_b, sq_h, sqp_b, sqp_h, s_ckv, s_kpe, so_b, so_h, sl_b,
                  num_heads, num_splits, qk_scale_log2, v_scale,
                  D_CKV: tl.constexpr, D_KPE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                  DIRECT: tl.constexpr, P_SPLIT: tl.constexpr, PV_FP16: tl.constexpr, DV_SPLIT: tl.constexpr,
                  QK_CHUNK: tl.constexpr, CONTIG: tl.constexpr, INTERPRETER: tl.constexpr):
    """Stage 1 with V's columns over DV_SPLIT programs, the QK dot in QK_CHUNK pieces and the
    contiguous-run load (Config.dv_split / qk_chunk / contig). Program (column part + head block,
    request, split): the column parts of one tile are neighbours in launch order, so the second
    read of a row is an L2 hit. Every part computes the same logits, softmax and LSE."""
    DV: tl.constexpr = D_CKV // DV_SPLIT
    CHUNK: tl.constexpr = D_CKV if QK_CHUNK == 0 else QK_CHUNK
    part = tl.program_id(0) % DV_SPLIT
    heads = (tl.program_id(0) // DV_SPLIT) * BLOCK_H + tl.arange(0, BLOCK_H)
    b = tl.program_id(1)
    split = tl.program_id(2)
    h_ok = heads < num_heads
    start, lo, hi = _split_range(indptr, b, split, num_splits, BLOCK_N)

    dc = tl.arange(0, CHUNK)
    dp = tl.arange(0, D_KPE)
    dv = part * DV + tl.arange(0, DV)
    q_row = q_nope + b.to(tl.int64) * sq_b + heads[:, None] * sq_h
    qp = tl.load(q_pe + b.to(tl.int64) * sqp_b + heads[:, None] * sqp_h + dp[None, :], mask=h_ok[:, None], other=0.0)
    if INTERPRETER:
        qp = qp.to(tl.float32)
    if QK_CHUNK == 0:
        qn = tl.load(q_row + dc[None, :], mask=h_ok[:, None], other=0.0)
        if INTERPRETER:
            qn = qn.to(tl.float32)

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, DV], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        ok = offs < hi
        idx = tl.load(indices + start + offs, mask=ok, other=0)
        row = idx.to(tl.int64)
        if CONTIG:  # one run of consecutive rows: addresses from its first row (a scalar)
            run, first = _contig_run(idx, n0 + BLOCK_N <= hi, BLOCK_N)
            if run:
                row = first.to(tl.int64) + tl.arange(0, BLOCK_N).to(tl.int64)
        row_c = row * s_ckv
        k_t = e4m3_to_bf16(tl.load(kpe + row[None, :] * s_kpe + dp[:, None], mask=ok[None, :], other=0))
        if INTERPRETER:
            k_t = k_t.to(tl.float32)
        qk = tl.dot(qp, k_t)
        for c0 in tl.static_range(0, D_CKV, CHUNK):
            c_t = e4m3_to_bf16(tl.load(ckv + row_c[None, :] + (c0 + dc)[:, None], mask=ok[None, :], other=0))
            if QK_CHUNK != 0:
                qn = tl.load(q_row + (c0 + dc)[None, :], mask=h_ok[:, None], other=0.0)
                if INTERPRETER:
                    qn = qn.to(tl.float32)
            if INTERPRETER:
                c_t = c_t.to(tl.float32)
            qk += tl.dot(qn, c_t)
        qk = tl.where(ok[None, :], qk * qk_scale_log2, float("-inf"))
        m_new = tl.maximum(m, tl.max(qk, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        v_u8 = tl.load(ckv + row_c[:, None] + dv[None, :], mask=ok[:, None], other=0)
        acc = _pv(acc * alpha[:, None], p, v_u8, P_SPLIT, PV_FP16, INTERPRETER, False)
        m = m_new

    empty = hi <= lo
    l = tl.where(empty, 1.0, l)
    o = tl.where(empty, 0.0, acc / l[:, None] * v_scale)
    lse2 = tl.where(empty, float("-inf"), m + tl.log2(l))
    if DIRECT:
        tl.store(out + b.to(tl.int64) * so_b + heads[:, None] * so_h + dv[None, :], _bf16(o, INTERPRETER), mask=h_ok[:, None])
        tl.store(lse + b.to(tl.int64) * sl_b + heads, lse2 * 0.6931471805599453, mask=h_ok & (heads * 0 + part == 0))
    else:
        slot = (b.to(tl.int64) * num_splits + split) * num_heads + heads
        tl.store(part_out + slot[:, None] * D_CKV + dv[None, :], o, mask=h_ok[:, None])
        tl.store(part_lse + slot, lse2, mask=h_ok & (heads * 0 + part == 0))


@triton.jit
def _stage2(part_out, part_lse, out, lse, so_b, so_h, sl_b, num_heads, num_splits,
            D_CKV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, INTERPRETER: tl.constexpr):
    b = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = heads < num_heads
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for split in range(num_splits):
        slot = (b.to(tl.int64) * num_splits + split) * num_heads + heads
        s_lse = tl.load(part_lse + slot, mask=h_ok, other=float("-inf"))
        s_out = tl.load(part_out + slot[:, None] * D_CKV + d[None, :], mask=h_ok[:, None], other=0.0)
        m_new = tl.maximum(m, s_lse)
        base = tl.where(m_new == float("-inf"), 0.0, m_new)  # all empty so far: weights exp2(-inf) = 0
        alpha = tl.exp2(m - base)
        w = tl.exp2(s_lse - base)
        acc = acc * alpha[:, None] + w[:, None] * s_out
        l = l * alpha + w
        m = m_new
    empty = m == float("-inf")
    l = tl.where(empty, 1.0, l)
    o = tl.where(empty[:, None], 0.0, acc / l[:, None])
    lse2 = tl.where(empty, float("-inf"), m + tl.log2(l))
    tl.store(out + b.to(tl.int64) * so_b + heads[:, None] * so_h + d[None, :], _bf16(o, INTERPRETER), mask=h_ok[:, None])
    if tl.program_id(2) == 0:
        tl.store(lse + b.to(tl.int64) * sl_b + heads, lse2 * 0.6931471805599453, mask=h_ok)


def part_out_dtype(config: Config) -> torch.dtype:
    """part_out's dtype: fp16 for the CUDA kernel (it stores o / l before kv_scale: |o| <= 448),
    fp32 for the Triton kernels."""
    return torch.float16 if config.cuda else torch.float32


def partial_buffers(batch: int, num_heads: int, config: Config, d_ckv: int, device) -> tuple[torch.Tensor, ...]:
    """(part_out [B, S, H, d_ckv] in `part_out_dtype(config)`, part_lse fp32 [B, S, H], arrivals
    int32 [B * ceil(H / 8)]) for a launch of `config` (S = its num_splits). arrivals (zeros; the
    CUDA kernel's CTA merge counts finished splits there and re-arms it) is unused by the Triton
    kernels and the CUDA pdl_merge."""
    num_splits = config.num_splits
    if num_splits == 1:
        empty = torch.empty(0, dtype=torch.float32, device=device)
        return empty, empty, torch.empty(0, dtype=torch.int32, device=device)
    return (torch.empty((batch, num_splits, num_heads, d_ckv), dtype=part_out_dtype(config), device=device),
            torch.empty((batch, num_splits, num_heads), dtype=torch.float32, device=device),
            torch.zeros(fused_mla_cuda.arrival_slots(batch, num_heads), dtype=torch.int32, device=device))


def _check(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices):
    if ckv.dtype != torch.uint8 or kpe.dtype != torch.uint8:
        raise TypeError(f"ckv and kpe must be uint8 e4m3 bits, got {ckv.dtype}, {kpe.dtype}")
    if q_nope.dtype != torch.bfloat16 or q_pe.dtype != torch.bfloat16:
        raise TypeError(f"queries must be bfloat16, got {q_nope.dtype}, {q_pe.dtype}")
    for name, t in (("kv_indptr", kv_indptr), ("kv_indices", kv_indices)):
        if t.dtype != torch.int32 or t.dim() != 1 or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous int32 [n], got {t.dtype} {tuple(t.shape)}")
    batch, heads, d_ckv = q_nope.shape
    d_kpe = q_pe.shape[-1]
    if q_pe.shape[:2] != (batch, heads) or kv_indptr.numel() != batch + 1:
        raise ValueError(f"bad shapes: q_nope {tuple(q_nope.shape)}, q_pe {tuple(q_pe.shape)}, "
                         f"kv_indptr {tuple(kv_indptr.shape)}")
    if ckv.shape[-1] != d_ckv or kpe.shape[-1] != d_kpe or ckv.shape[0] != kpe.shape[0]:
        raise ValueError(f"bad KV shapes: ckv {tuple(ckv.shape)}, kpe {tuple(kpe.shape)} for q {d_ckv}+{d_kpe}")
    for name, t in (("q_nope", q_nope), ("q_pe", q_pe)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} channels must be contiguous")
    return batch, heads, d_ckv, d_kpe


def fused_mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, ckv: torch.Tensor, kpe: torch.Tensor,
                     kv_indptr: torch.Tensor, kv_indices: torch.Tensor, sm_scale: float, config: Config,
                     kv_scale: float = 1.0, partials: tuple[torch.Tensor, ...] | None = None,
                     p_split: bool = P_SPLIT, indices_ready: bool = False,
                     new_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out bf16 [B, H, 512], lse fp32 [B, H], natural log) of absorbed-MLA decode.

    q_nope bf16 [B, H, 512], q_pe bf16 [B, H, 64]; ckv uint8 [rows, 1, 512] and kpe uint8
    [rows, 1, 64] (e4m3 bits; views of one pool row are fine); kv_indptr int32 [B+1] and
    kv_indices int32 [nnz] on the device (token-level: each index is a KV row). `partials`
    from `partial_buffers` (allocated here when None) hold the splits' results.
    `indices_ready`: kv_indptr / kv_indices were written before the stream's previous kernel
    started (a plan filled before the step), so the CUDA kernel may read them before it waits for
    that kernel (sm_90+, see fused_mla_cuda.decode); `new_tokens`: no kernel before it on the stream
    that may still be running when it starts (that one, or an earlier one it does not wait for) writes
    any KV row but each request's last `new_tokens` (a decode step: its new token, 1), so with
    `indices_ready` the rows before them may be loaded before the wait too. None: any row may be written.
    """
    batch, heads, d_ckv, d_kpe = _check(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices)
    if new_tokens is not None and new_tokens < 0:
        raise ValueError(f"new_tokens must be None or >= 0, got {new_tokens}")
    dev = q_nope.device
    out = torch.empty((batch, heads, d_ckv), dtype=torch.bfloat16, device=dev)
    lse = torch.empty((batch, heads), dtype=torch.float32, device=dev)
    if batch == 0:
        return out, lse
    splits = config.num_splits
    part_out, part_lse, arrivals = partials if partials is not None else partial_buffers(batch, heads, config, d_ckv, dev)
    if splits > 1 and (part_out.shape != (batch, splits, heads, d_ckv) or part_lse.shape != (batch, splits, heads)):
        raise ValueError(f"partials {tuple(part_out.shape)}, {tuple(part_lse.shape)} do not fit "
                         f"B={batch}, S={splits}, H={heads}")
    want = part_out_dtype(config)
    if splits > 1 and part_out.dtype != want:
        raise ValueError(f"partials: part_out is {part_out.dtype}, {config} needs {want} (see partial_buffers)")
    ckv2, kpe2 = ckv.reshape(ckv.shape[0], -1), kpe.reshape(kpe.shape[0], -1)
    head_blocks = triton.cdiv(heads, BLOCK_H)
    if config.cuda:
        if INTERPRETED or dev.type != "cuda":
            raise ValueError(f"{config}: the CUDA kernel runs on a CUDA device only (not under TRITON_INTERPRET=1)")
        # the cluster merge's requests past one wave of clusters are merged by their last CTA too
        if splits > 1 and config.merge_by != "kernel" and arrivals.numel() < fused_mla_cuda.arrival_slots(batch, heads):
            raise ValueError(f"arrivals {tuple(arrivals.shape)} do not fit B={batch}, H={heads}")
        fused_mla_cuda.decode(q_nope, q_pe, ckv2, kpe2, kv_indptr, kv_indices, part_out, part_lse, arrivals, out, lse,
                              float(sm_scale) * float(kv_scale) / LN2, float(kv_scale), splits,
                              config.cuda_instance(heads), config.merge_by, indices_ready, new_tokens)
        return out, lse
    if config.tokens_m:
        if d_ckv % 64:
            raise ValueError(f"{config}: d_ckv {d_ckv} does not divide into four 16-aligned column parts")
        _stage1_tokm[(batch, splits, head_blocks)](
            q_nope, q_pe, ckv2, kpe2, kv_indptr, kv_indices, part_out, part_lse, out, lse,
            q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), ckv2.stride(0), kpe2.stride(0),
            out.stride(0), out.stride(1), lse.stride(0),
            heads, splits, float(sm_scale) * float(kv_scale) / LN2, float(kv_scale),
            D_CKV=d_ckv, D_KPE=d_kpe, BLOCK_H=BLOCK_H, BLOCK_N=config.block_n, DIRECT=splits == 1, P_SPLIT=p_split,
            PV_FP16=config.pv_fp16, INTERPRETER=INTERPRETED, num_warps=config.num_warps, num_stages=config.num_stages)
    elif config.split_kernel:
        if d_ckv % (config.dv_split * 16) or (config.qk_chunk and d_ckv % config.qk_chunk):
            raise ValueError(f"{config}: d_ckv {d_ckv} does not divide into its column parts / chunks")
        _stage1_split[(config.dv_split * head_blocks, batch, splits)](
            q_nope, q_pe, ckv2, kpe2, kv_indptr, kv_indices, part_out, part_lse, out, lse,
            q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), ckv2.stride(0), kpe2.stride(0),
            out.stride(0), out.stride(1), lse.stride(0),
            heads, splits, float(sm_scale) * float(kv_scale) / LN2, float(kv_scale),
            D_CKV=d_ckv, D_KPE=d_kpe, BLOCK_H=BLOCK_H, BLOCK_N=config.block_n, DIRECT=splits == 1, P_SPLIT=p_split,
            PV_FP16=config.pv_fp16, DV_SPLIT=config.dv_split, QK_CHUNK=config.qk_chunk, CONTIG=config.contig,
            INTERPRETER=INTERPRETED, num_warps=config.num_warps, num_stages=config.num_stages)
    else:
        _stage1[(batch, splits, head_blocks)](
            q_nope, q_pe, ckv2, kpe2, kv_indptr, kv_indices, part_out, part_lse, out, lse,
            q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), ckv2.stride(0), kpe2.stride(0),
            out.stride(0), out.stride(1), lse.stride(0),
            heads, splits, float(sm_scale) * float(kv_scale) / LN2, float(kv_scale),
            D_CKV=d_ckv, D_KPE=d_kpe, BLOCK_H=BLOCK_H, BLOCK_N=config.block_n, DIRECT=splits == 1, P_SPLIT=p_split, RELOAD_V=config.reload_v,
            PV_FP16=config.pv_fp16, PREFETCH=config.prefetch,
            INTERPRETER=INTERPRETED,
            num_warps=config.num_warps, num_stages=config.num_stages)
    if splits > 1:
        block_d = min(STAGE2_BLOCK_D, d_ckv)
        _stage2[(batch, head_blocks, triton.cdiv(d_ckv, block_d))](
            part_out, part_lse, out, lse, out.stride(0), out.stride(1), lse.stride(0), heads, splits,
            D_CKV=d_ckv, BLOCK_D=block_d, BLOCK_H=BLOCK_H, INTERPRETER=INTERPRETED, num_warps=STAGE2_WARPS)
    return out, lse


AOT_STAGE = "attend"  # harness.kernels.sm120_compile


def aot_specs(width: int):
    """The fused FP8 MLA decode: stage 1 (split, direct, the reload-V / fp16-P.V and
    prefetch variants, the split kernel's column parts / QK chunks / contiguous runs, the
    tokens-as-M kernel), stage 2."""
    ptr = dict(q_nope="*bf16", q_pe="*bf16", ckv="*u8", kpe="*u8", indptr="*i32", indices="*i32",
               part_out="*fp32", part_lse="*fp32", out="*bf16", lse="*fp32")
    ints = {k: "i32" for k in ("sq_b", "sq_h", "sqp_b", "sqp_h", "s_ckv", "s_kpe", "so_b", "so_h", "sl_b",
                               "num_heads", "num_splits")}
    stage1 = dict(ptr, **ints, qk_scale_log2="fp32", v_scale="fp32")
    tile = dict(D_CKV=512, D_KPE=64, BLOCK_H=BLOCK_H, BLOCK_N=32, P_SPLIT=P_SPLIT, RELOAD_V=False,
                PV_FP16=False, PREFETCH=False, INTERPRETER=False)
    split = dict(D_CKV=512, D_KPE=64, BLOCK_H=BLOCK_H, BLOCK_N=32, DIRECT=False, P_SPLIT=P_SPLIT,
                 PV_FP16=True, DV_SPLIT=1, QK_CHUNK=0, CONTIG=False, INTERPRETER=False)
    stage2 = dict(part_out="*fp32", part_lse="*fp32", out="*bf16", lse="*fp32", so_b="i32", so_h="i32",
                  sl_b="i32", num_heads="i32", num_splits="i32")
    return [
        ("fused_mla_stage1", _stage1, stage1, dict(tile, DIRECT=False), 4),
        ("fused_mla_stage1_direct", _stage1, stage1, dict(tile, DIRECT=True), 4),
        ("fused_mla_stage1_reload_fp16", _stage1, stage1,
         dict(tile, DIRECT=False, BLOCK_N=64, RELOAD_V=True, PV_FP16=True), 8),
        ("fused_mla_stage1_prefetch", _stage1, stage1, dict(tile, DIRECT=False, PREFETCH=True), 4),
        ("fused_mla_stage1_split_dv2", _stage1_split, stage1, dict(split, DV_SPLIT=2), 4),
        ("fused_mla_stage1_split_dv4_contig_direct", _stage1_split, stage1,
         dict(split, DIRECT=True, DV_SPLIT=4, CONTIG=True), 4),
        ("fused_mla_stage1_split_chunk_hilo", _stage1_split, stage1,
         dict(split, PV_FP16=False, QK_CHUNK=128, BLOCK_N=64), 8),
        ("fused_mla_stage1_tokens_m", _stage1_tokm, stage1,
         dict(D_CKV=512, D_KPE=64, BLOCK_H=BLOCK_H, BLOCK_N=64, DIRECT=False, P_SPLIT=P_SPLIT, PV_FP16=True,
              INTERPRETER=False), 4),
        ("fused_mla_stage2", _stage2, stage2,
         dict(D_CKV=512, BLOCK_D=STAGE2_BLOCK_D, BLOCK_H=BLOCK_H, INTERPRETER=False), STAGE2_WARPS),
    ]
