"""The Triton kernels on CPU: run under the Triton interpreter and checked bit for bit
against harness.spec.synth and torch, plus ahead-of-time compilation for sm_120.

TRITON_INTERPRET must be set before triton is first imported (triton's own library
functions are decorated at import), so in an ordinary run this file reruns itself in
a fresh `TRITON_INTERPRET=1` pytest process (test_kernels_under_interpreter) and its
interpreter tests are skipped in the parent; the AOT test runs in the parent only.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from harness.kernels import cast, gather_cast, shadow_write, synth_fill  # noqa: E402
from harness.spec import synth  # noqa: E402
from suites.helpers import INTERPRETED, run_under_interpreter  # noqa: E402

interpreted = pytest.mark.skipif(
    not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 child process of test_kernels_under_interpreter")
WIDTH = 576
ODD_WIDTH = 70  # head 64 + tail 6 (masked to 8), channel chunk 2
NAN_CODES = (0x7F, 0xFF)


@pytest.mark.skipif(INTERPRETED, reason="this is the TRITON_INTERPRET=1 child run")
def test_kernels_under_interpreter():
    """Every interpreter test below, in a fresh process with TRITON_INTERPRET=1."""
    proc = run_under_interpreter(__file__)
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-10000:] + proc.stderr[-3000:]


def bits(t: torch.Tensor) -> torch.Tensor:
    """Integer view of t's bits, for bitwise comparison."""
    return t.view({1: torch.uint8, 2: torch.int16}[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


def ref_bf16(codes_u8: torch.Tensor) -> torch.Tensor:
    return codes_u8.view(torch.float8_e4m3fn).to(torch.bfloat16)


def poisoned(rows: int, width: int) -> torch.Tensor:
    """bf16 [rows, 1, width] of a NaN bit pattern no cast produces (0x7FA5)."""
    return torch.full((rows, 1, width), 0x7FA5, dtype=torch.int16).view(torch.bfloat16)


def filled_pool(rows: int, width: int, seed: int = 7, layer: int = 3) -> torch.Tensor:
    return synth_fill.fill_layer_(torch.full((rows, 1, width), 0xAB, dtype=torch.uint8), seed, layer)


@interpreted
@pytest.mark.parametrize("width", [WIDTH, ODD_WIDTH])
def test_fill_layer_matches_synth(width):
    rows = 101  # 100 slots: not a multiple of the 32-row block
    pool = filled_pool(rows, width)
    assert torch.equal(pool[0], torch.zeros_like(pool[0]))
    assert torch.equal(pool[1:, 0], synth.kv_codes(7, 3, np.arange(1, rows), 0, width))
    # negative control: the neighbouring layer's codes must not match
    assert not torch.equal(pool[1:, 0], synth.kv_codes(7, 4, np.arange(1, rows), 0, width))


@interpreted
def test_fill_layer_paged_matches_the_host_pool():
    """A 64-token-page pool (GLM-5): the first page zero, then the same bytes as the CPU fill."""
    from harness.inputs.pool import KVPool, PoolGeometry

    host = KVPool(PoolGeometry(128, 1, WIDTH, page_size=64), seed=7, device=torch.device("cpu")).buffers[0]
    pool = synth_fill.fill_layer_(torch.full((192, 1, WIDTH), 0xAB, dtype=torch.uint8), 7, 0, page_size=64)
    assert not pool[:64].any() and torch.equal(pool, host)
    # negative control: the page-1 fill puts slot 1's codes in row 1, not zeros, and shifts nothing
    assert not torch.equal(synth_fill.fill_layer_(pool.clone(), 7, 0), host)


@interpreted
def test_fill_layer_2d_buffer():
    pool = synth_fill.fill_layer_(torch.ones((40, WIDTH), dtype=torch.uint8), 1, 0)
    assert torch.equal(pool[1:], synth.kv_codes(1, 0, np.arange(1, 40), 0, WIDTH))
    assert int(pool[0].sum()) == 0


@interpreted
@pytest.mark.parametrize("width", [WIDTH, ODD_WIDTH])
def test_kv_codes_matches_synth(width):
    rng = np.random.default_rng(0)
    slots = np.concatenate([[0, 1, 2**31 - 1, 2**31, 2**32 - 1], rng.integers(0, 2**32, 60)])
    gens = rng.integers(0, 2**32, slots.size)
    got = synth_fill.kv_codes_cuda(11, 77, slots, gens, width, device="cpu")
    assert torch.equal(got, synth.kv_codes(11, 77, slots, gens, width))
    assert torch.equal(synth_fill.kv_codes_cuda(11, 77, slots, 5, width, device="cpu"),
                       synth.kv_codes(11, 77, slots, 5, width))
    # negative control: shifted slots must not match
    shifted = synth_fill.kv_codes_cuda(11, 77, slots + 1, gens, width, device="cpu")
    assert not torch.equal(shifted, synth.kv_codes(11, 77, slots, gens, width))


@interpreted
def test_cast_all_codes():
    src = torch.arange(256, dtype=torch.uint8).repeat(17)[: 256 * 17 - 3]  # a partial last block
    out = cast.cast_pool_to_bf16(src, torch.empty(src.shape, dtype=torch.bfloat16))
    finite = ~torch.isin(src, torch.tensor(NAN_CODES, dtype=torch.uint8))
    # The interpreter turns the NaN codes into +-480 (hardware gives NaN): finite codes only here.
    assert same_bits(out[finite], ref_bf16(src)[finite])
    assert finite.sum() == src.numel() - 2 * 17 + 1
    # negative control: a shifted input must not match
    shifted = cast.cast_pool_to_bf16(src.roll(1), torch.empty(src.shape, dtype=torch.bfloat16))
    assert not same_bits(shifted[finite], ref_bf16(src)[finite])


@interpreted
def test_cast_pool_shape():
    pool = filled_pool(9, WIDTH)
    out = cast.cast_pool_to_bf16(pool, torch.empty(pool.shape, dtype=torch.bfloat16))
    assert same_bits(out, ref_bf16(pool))


@interpreted
@pytest.mark.parametrize("width", [WIDTH, ODD_WIDTH])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_gather_cast(width, index_dtype):
    pool = filled_pool(300, width)
    n, capacity = 37, 45
    idx = torch.from_numpy(np.random.default_rng(1).integers(0, 300, n)).to(index_dtype)
    idx[:3] = torch.tensor([0, 299, 299])
    out = gather_cast.gather_cast_(pool, idx, poisoned(capacity, width))
    assert same_bits(out[:n], ref_bf16(pool[idx.long()]))
    assert same_bits(out[n:], poisoned(capacity - n, width))
    # negative control: an off-by-one remap must not match
    assert not same_bits(out[:n], ref_bf16(pool[(idx.long() + 1) % 300]))


@interpreted
def test_gather_cast_device_count():
    pool = filled_pool(300, WIDTH)
    idx = torch.arange(5, 45, dtype=torch.int32)
    for count in (0, 13, 40, 99):
        out = gather_cast.gather_cast_(pool, idx, poisoned(48, WIDTH), torch.tensor([count], dtype=torch.int32))
        m = min(count, idx.numel())
        assert same_bits(out[:m], ref_bf16(pool[idx[:m].long()]))
        assert same_bits(out[m:], poisoned(48 - m, WIDTH))


@interpreted
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_write_fp8_and_bf16(slot_dtype):
    pool = filled_pool(200, WIDTH)
    before = pool.clone()
    shadow = ref_bf16(pool)
    slots = torch.from_numpy(np.random.default_rng(2).permutation(np.arange(1, 200))[:13]).to(slot_dtype)
    codes = synth.kv_codes(7, 3, slots.numpy(), 1, WIDTH)
    expect = pool.clone()
    expect[slots.long(), 0] = codes
    shadow_write.write_fp8_and_bf16_(pool, shadow, slots, codes)
    assert torch.equal(pool, expect)
    assert same_bits(shadow, ref_bf16(expect))  # written rows fresh, all others untouched
    # negative controls: a dropped token in the pool and a stale shadow row are detected
    s = slots[5].item()
    dropped, stale = pool.clone(), shadow.clone()
    dropped[s], stale[s] = before[s], ref_bf16(before[s])
    assert not torch.equal(dropped, expect)
    assert not same_bits(stale, ref_bf16(expect))


@pytest.mark.skipif(INTERPRETED, reason="AOT compilation needs compiled (not interpreted) kernels")
def test_aot_compile_sm120():
    """Every kernel compiles ahead of time for sm_120 with no GPU present (sm_90 builds for real
    on the H200 runners)."""
    from harness.kernels import sm120_compile

    assert sm120_compile.compile_all_for(120) == [
        "fill_layer", "kv_codes", "cast", "gather_cast", "gather_cast_count", "write_fp8_and_bf16",
        "fused_mla_stage1", "fused_mla_stage1_direct", "fused_mla_stage1_reload_fp16",
        "fused_mla_stage1_prefetch", "fused_mla_stage1_split_dv2", "fused_mla_stage1_split_dv4_contig_direct",
        "fused_mla_stage1_split_chunk_hilo", "fused_mla_stage1_tokens_m", "fused_mla_stage2"]


@triton.jit
def _bad_ptx_kernel(x, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x + offs, mask=offs < n)
    v = tl.inline_asm_elementwise("no.such.instruction.b32 $0, $1;", "=r,r", [v], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(x + offs, v, mask=offs < n)


@pytest.mark.skipif(INTERPRETED, reason="AOT compilation needs compiled (not interpreted) kernels")
def test_aot_compile_rejects_a_kernel_that_does_not_build(monkeypatch):
    """Negative control of test_aot_compile_sm120: a kernel ptxas rejects makes compile_all_for fail."""
    from harness.kernels import sm120_compile

    bad = ("bad_ptx", _bad_ptx_kernel, dict(x="*i32", n="i32"), dict(BLOCK=128), 4)
    monkeypatch.setattr(sm120_compile, "_specs", lambda width: [bad])
    with pytest.raises(Exception, match="no.such.instruction|ptxas|PTX"):
        sm120_compile.compile_all_for(120)


@pytest.mark.skipif(INTERPRETED, reason="AOT compilation needs compiled (not interpreted) kernels")
def test_e4m3_kernels_build_from_the_arch_the_strategies_claim():
    """The strategies' sm_89 floor for their Triton e4m3 kernels (TRITON_E4M3_ARCH) is Triton's own: the e4m3 cast
    builds for it and fails for sm_80 (an A100), where those strategies report unsupported."""
    from triton.backends.compiler import GPUTarget

    from harness.kernels import sm120_compile
    from harness.strategies.base import TRITON_E4M3_ARCH

    (label, kernel, signature, constexprs, num_warps), = cast.aot_specs(WIDTH)
    source = lambda: sm120_compile._source(kernel, signature, constexprs)  # noqa: E731
    arch = TRITON_E4M3_ARCH[0] * 10 + TRITON_E4M3_ARCH[1]
    assert triton.compile(source(), target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps}).asm.get("cubin")
    with pytest.raises(Exception) as failed:
        triton.compile(source(), target=GPUTarget("cuda", 80, 32), options={"num_warps": num_warps})
    causes, error = [], failed.value
    while error is not None:  # Triton's CompilationError names the line; its cause the type
        causes.append(str(error))
        error = error.__cause__ or error.__context__
    assert any("fp8e4nv not supported" in text for text in causes), causes
