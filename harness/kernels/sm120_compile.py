"""Ahead-of-time compilation of every kernel here for a CUDA target, without a GPU.

Evidence that the kernels build for an architecture we cannot run on (sm_120,
RTX PRO 6000 Blackwell): each kernel is compiled through triton.compile with the
launch configuration and argument specialization (16-byte aligned pointers and
row strides) that the wrappers use, and must yield a non-empty cubin.
"""

from __future__ import annotations

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from harness.kernels import cast, fused_mla_decode, gather_cast, shadow_write, synth_fill
from harness.kernels.rowtile import split_width

ROW_WIDTH = 576


def _specs(width: int):
    """(label, kernel, signature, constexprs, num_warps) for every launched variant."""
    head, tail, tail_p2 = split_width(width)
    rows = dict(HEAD=head, TAIL=tail, TAIL_P2=tail_p2)
    fill = dict(out="*u8", out_stride="i32", n_rows="i32", first_slot="i32", key="i32", table="*u8")
    synth_c = dict(WIDTH=width, BLOCK_R=synth_fill.BLOCK_R, BLOCK_C=synth_fill.block_c(width))
    gather = dict(src="*u8", src_stride="i32", indices="*i32", out="*bf16", out_stride="i32", n="i32")
    return [
        ("fill_layer", synth_fill.kv_codes_kernel, dict(fill, slots="*u8", gens="*u8"),
         dict(synth_c, SLOTS_FROM_ROW=True), synth_fill.NUM_WARPS),
        ("kv_codes", synth_fill.kv_codes_kernel, dict(fill, slots="*i64", gens="*i64"),
         dict(synth_c, SLOTS_FROM_ROW=False), synth_fill.NUM_WARPS),
        ("cast", cast.cast_kernel, dict(src="*u8", dst="*bf16", n="i32"),
         dict(BLOCK=cast.BLOCK), cast.NUM_WARPS),
        ("gather_cast", gather_cast.gather_cast_kernel, dict(gather, count="*i32"),
         dict(rows, HAS_COUNT=False, BLOCK_R=gather_cast.BLOCK_R), gather_cast.NUM_WARPS),
        ("gather_cast_count", gather_cast.gather_cast_kernel, dict(gather, count="*i32"),
         dict(rows, HAS_COUNT=True, BLOCK_R=gather_cast.BLOCK_R), gather_cast.NUM_WARPS),
        ("write_fp8_and_bf16", shadow_write.write_fp8_and_bf16_kernel,
         dict(pool="*u8", pool_stride="i32", shadow="*bf16", shadow_stride="i32", slots="*i64",
              codes="*u8", codes_stride="i32", n="i32"),
         dict(rows, BLOCK_R=shadow_write.BLOCK_R), shadow_write.NUM_WARPS),
        *_fused_specs(),
    ]


def _fused_specs():
    """The fused FP8 MLA decode: stage 1 (split, direct, the reload-V / fp16-P.V and
    prefetch variants, the split kernel's column parts / QK chunks / contiguous runs, the
    tokens-as-M kernel), stage 2."""
    fm = fused_mla_decode
    ptr = dict(q_nope="*bf16", q_pe="*bf16", ckv="*u8", kpe="*u8", indptr="*i32", indices="*i32",
               part_out="*fp32", part_lse="*fp32", out="*bf16", lse="*fp32")
    ints = {k: "i32" for k in ("sq_b", "sq_h", "sqp_b", "sqp_h", "s_ckv", "s_kpe", "so_b", "so_h", "sl_b",
                               "num_heads", "num_splits")}
    stage1 = dict(ptr, **ints, qk_scale_log2="fp32", v_scale="fp32")
    tile = dict(D_CKV=512, D_KPE=64, BLOCK_H=fm.BLOCK_H, BLOCK_N=32, P_SPLIT=fm.P_SPLIT, RELOAD_V=False,
                PV_FP16=False, PREFETCH=False, INTERPRETER=False)
    split = dict(D_CKV=512, D_KPE=64, BLOCK_H=fm.BLOCK_H, BLOCK_N=32, DIRECT=False, P_SPLIT=fm.P_SPLIT,
                 PV_FP16=True, DV_SPLIT=1, QK_CHUNK=0, CONTIG=False, INTERPRETER=False)
    stage2 = dict(part_out="*fp32", part_lse="*fp32", out="*bf16", lse="*fp32", so_b="i32", so_h="i32",
                  sl_b="i32", num_heads="i32", num_splits="i32")
    return [
        ("fused_mla_stage1", fm._stage1, stage1, dict(tile, DIRECT=False), 4),
        ("fused_mla_stage1_direct", fm._stage1, stage1, dict(tile, DIRECT=True), 4),
        ("fused_mla_stage1_reload_fp16", fm._stage1, stage1,
         dict(tile, DIRECT=False, BLOCK_N=64, RELOAD_V=True, PV_FP16=True), 8),
        ("fused_mla_stage1_prefetch", fm._stage1, stage1, dict(tile, DIRECT=False, PREFETCH=True), 4),
        ("fused_mla_stage1_split_dv2", fm._stage1_split, stage1, dict(split, DV_SPLIT=2), 4),
        ("fused_mla_stage1_split_dv4_contig_direct", fm._stage1_split, stage1,
         dict(split, DIRECT=True, DV_SPLIT=4, CONTIG=True), 4),
        ("fused_mla_stage1_split_chunk_hilo", fm._stage1_split, stage1,
         dict(split, PV_FP16=False, QK_CHUNK=128, BLOCK_N=64), 8),
        ("fused_mla_stage1_tokens_m", fm._stage1_tokm, stage1,
         dict(D_CKV=512, D_KPE=64, BLOCK_H=fm.BLOCK_H, BLOCK_N=64, DIRECT=False, P_SPLIT=fm.P_SPLIT, PV_FP16=True,
              INTERPRETER=False), 4),
        ("fused_mla_stage2", fm._stage2, stage2,
         dict(D_CKV=512, BLOCK_D=fm.STAGE2_BLOCK_D, BLOCK_H=fm.BLOCK_H, INTERPRETER=False), fm.STAGE2_WARPS),
    ]


def _source(kernel, signature, constexprs):
    """An ASTSource with arguments in kernel order; pointers, strides and the cast's element
    count marked 16-divisible, as the JIT specializes them for 576-channel pools."""
    names = kernel.arg_names
    sig = {k: signature.get(k, "constexpr") for k in names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(names)
               if sig[k].startswith("*") or k.endswith("_stride") or kernel is cast.cast_kernel and k == "n"}
    return ASTSource(kernel, signature=sig, constexprs=constexprs, attrs=aligned)


def compile_all_for(capability: int, width: int = ROW_WIDTH) -> list[str]:
    """Compile every kernel variant for sm_<capability>; return their labels."""
    target = GPUTarget("cuda", capability, 32)
    labels = []
    for label, kernel, signature, constexprs, num_warps in _specs(width):
        compiled = triton.compile(_source(kernel, signature, constexprs), target=target,
                                  options={"num_warps": num_warps})
        if not compiled.asm.get("cubin"):
            raise RuntimeError(f"{label}: empty cubin for sm_{capability}")
        labels.append(label)
    return labels
