"""fused_fp8 on the CPU: the Triton kernel under the interpreter against a float64 reference and
through the runner against the ci goldens (with negative controls), plus the tuning table and
the roofline arithmetic.

As in test_kernels_interpret.py, the interpreter tests run in a fresh TRITON_INTERPRET=1
pytest process (test_fused_under_interpreter) and are skipped in the parent. The interpreter
turns the e4m3 NaN codes into +-480, so NaN propagation is checked on the GPU
(suites/gpu/test_fused_fp8_gpu.py).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from harness.errors import HarnessError  # noqa: E402
from harness.spec.faults import Fault  # noqa: E402
from suites.helpers import INTERPRETED, run_strategies, run_under_interpreter  # noqa: E402

interpreted = pytest.mark.skipif(
    not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 child process of test_fused_under_interpreter")
SM_SCALE = 1 / math.sqrt(192)


@pytest.mark.skipif(INTERPRETED, reason="this is the TRITON_INTERPRET=1 child run")
def test_fused_under_interpreter():
    proc = run_under_interpreter(__file__, "-W", "ignore::RuntimeWarning")
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-10000:] + proc.stderr[-3000:]


def reference(q_nope, q_pe, pool, indptr, indices, kv_scale=1.0):
    kv = pool.reshape(pool.shape[0], -1).view(torch.float8_e4m3fn)
    outs, lses = [], []
    for b in range(q_nope.shape[0]):
        rows = kv[indices[indptr[b]:indptr[b + 1]].long()].double() * kv_scale
        logits = (q_nope[b].double() @ rows[:, :512].T + q_pe[b].double() @ rows[:, 512:].T) * SM_SCALE
        lse = torch.logsumexp(logits, -1)
        outs.append(torch.exp(logits - lse[:, None]) @ rows[:, :512])
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def problem(lens, heads, rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    pool = torch.randint(0, 0x7E, (rows, 1, 576), generator=g, dtype=torch.uint8)
    pool |= torch.randint(0, 2, pool.shape, generator=g, dtype=torch.uint8) << 7
    pool &= 0xBF  # |value| < 2, both signs, no NaN code
    indices = torch.randint(0, rows, (sum(lens),), generator=g, dtype=torch.int32)
    indptr = torch.tensor([0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)
    return (torch.randn(len(lens), heads, 512, generator=g).to(torch.bfloat16),
            torch.randn(len(lens), heads, 64, generator=g).to(torch.bfloat16), pool, indptr, indices)


def kernel(q_nope, q_pe, pool, indptr, indices, config, kv_scale=1.0):
    from harness.kernels.fused_mla_decode import fused_mla_decode

    return fused_mla_decode(q_nope, q_pe, pool[..., :512], pool[..., 512:], indptr, indices, SM_SCALE, config,
                            kv_scale=kv_scale)


def norm_rel(out, ref):
    return float((out.double() - ref).norm() / ref.norm())


# The tokens-as-M kernel (Config.tokens_m): direct and split, hi + lo and fp16 P.V, the wgmma tile
# (64 rows: several tiles per split only for the 97-token request), 16- and 32-row tiles, 8 warps.
TOKENS_M_CONFIGS = [dict(num_splits=1, block_n=64, tokens_m=True), dict(num_splits=3, block_n=16, pv_fp16=True, tokens_m=True),
                    dict(num_splits=2, block_n=64, num_stages=5, pv_fp16=True, tokens_m=True),
                    dict(num_splits=3, block_n=32, num_warps=8, num_stages=3, tokens_m=True)]


@interpreted
@pytest.mark.parametrize("lens, heads", [([1, 2, 3, 5, 7], 8), ([0, 97, 13], 20)])
def test_kernel_against_float64(lens, heads):
    """Lengths 0, 1, 2 and primes, an odd batch, heads over two blocks, one and several splits."""
    from harness.kernels.fused_mla_decode import Config

    args = problem(lens, heads, rows=400)
    ref_out, ref_lse = reference(*args)
    for config in (Config(1, 16), Config(3, 32), Config(2, 16, reload_v=True, pv_fp16=True),
                   Config(3, 16, prefetch=True), *(Config(**f) for f in TOKENS_M_CONFIGS)):
        out, lse = kernel(*args, config)
        empty = torch.tensor(lens) == 0
        assert torch.equal(out[empty], torch.zeros_like(out[empty])) and bool((lse[empty] == -math.inf).all())
        assert norm_rel(out[~empty], ref_out[~empty]) < 3e-3, config
        assert float((lse[~empty].double() - ref_lse[~empty]).abs().max()) < 1e-4, config
    # negative controls: a 1% KV scale and a dropped last token are both outside the tolerance
    scaled, _ = kernel(*args, Config(3, 32), kv_scale=1.01)
    assert norm_rel(scaled[~empty], ref_out[~empty]) > 4e-3
    q_nope, q_pe, pool, indptr, indices = args
    short = indptr.clone()
    short[-1] -= 1
    dropped, _ = kernel(q_nope, q_pe, pool, short, indices, Config(3, 32))
    assert norm_rel(dropped[-1:], ref_out[-1:]) > 4e-3
    for config in (Config(**f) for f in TOKENS_M_CONFIGS[:2]):  # and in the tokens-as-M kernel, direct and split
        scaled, _ = kernel(*args, config, kv_scale=1.01)
        assert norm_rel(scaled[~empty], ref_out[~empty]) > 4e-3, config
        dropped, _ = kernel(q_nope, q_pe, pool, short, indices, config)
        assert norm_rel(dropped[-1:], ref_out[-1:]) > 4e-3, config


def paged(lens, rows, seed, page=64):
    """Token-level indices laid out as the paged allocator does: each request on random whole pages
    of `page` rows (in random order), its tokens consecutive inside a page."""
    g = torch.Generator().manual_seed(seed)
    pages = (torch.randperm(rows // page, generator=g) * page).tolist()
    out = []
    for n in lens:
        need = -(-n // page)
        mine, pages = pages[:need], pages[need:]
        out.append((torch.tensor(mine)[:, None] + torch.arange(page)).reshape(-1)[:n])
    return torch.cat(out).to(torch.int32)


# The split kernel (Config.dv_split / qk_chunk / contig) over its column parts, chunk widths and
# the contiguous-run load, with the bf16 hi + lo and the fp16 P.V dot, one and several splits.
SPLIT_CONFIGS = [dict(num_splits=1, block_n=16, dv_split=2), dict(num_splits=3, block_n=16, dv_split=4, pv_fp16=True),
                 dict(num_splits=2, block_n=32, qk_chunk=128, num_stages=5),
                 dict(num_splits=1, block_n=16, contig=True, pv_fp16=True),
                 dict(num_splits=3, block_n=16, dv_split=2, qk_chunk=256, contig=True, num_stages=7)]


@interpreted
@pytest.mark.parametrize("layout", ["scattered", "paged"])
@pytest.mark.parametrize("lens, heads", [([1, 2, 3, 5, 7, 31, 64], 8), ([0, 97, 13], 20)])
def test_split_kernel_against_float64(lens, heads, layout):
    """Every split-kernel path (and the tokens-as-M kernel) against the float64 reference: an odd batch, lengths 0, 1, 2 and
    primes, a full page, heads over two blocks, page-contiguous indices; scattered indices for the contig configs, the
    only ones whose code path depends on the layout (a run is loaded from its first row, anything else is gathered)."""
    from harness.kernels.fused_mla_decode import Config

    q_nope, q_pe, pool, indptr, indices = problem(lens, heads, rows=64 * 8, seed=11)
    if layout == "paged":
        indices = paged(lens, 64 * 8, seed=12)
    ref_out, ref_lse = reference(q_nope, q_pe, pool, indptr, indices)
    empty = torch.tensor(lens) == 0
    for fields in (*SPLIT_CONFIGS, TOKENS_M_CONFIGS[1], TOKENS_M_CONFIGS[2]):
        if layout == "scattered" and not fields.get("contig"):
            continue  # gathered row by row whatever the layout: the paged run covers it
        config = Config(**fields)
        out, lse = kernel(q_nope, q_pe, pool, indptr, indices, config)
        assert torch.equal(out[empty], torch.zeros_like(out[empty])) and bool((lse[empty] == -math.inf).all())
        assert norm_rel(out[~empty], ref_out[~empty]) < 3e-3, config
        assert float((lse[~empty].double() - ref_lse[~empty]).abs().max()) < 1e-4, config
    # negative control: a dropped last token shows in the split kernel too
    short = indptr.clone()
    short[-1] -= 1
    dropped, _ = kernel(q_nope, q_pe, pool, short, indices, Config(3, 16, dv_split=2, contig=True))
    assert norm_rel(dropped[-1:], ref_out[-1:]) > 4e-3


# Planted faults in the contiguous-run check (negative controls of Config.contig).
@triton.jit
def _contig_off_by_one(idx, full, BLOCK_N: tl.constexpr):
    first = tl.min(idx, 0)
    return full & (tl.max(tl.abs(idx - first - tl.arange(0, BLOCK_N)), 0) == 0), first + 1


@triton.jit
def _contig_ends_only(idx, full, BLOCK_N: tl.constexpr):
    ar = tl.arange(0, BLOCK_N)
    first = tl.sum(tl.where(ar == 0, idx, 0), 0)
    last = tl.sum(tl.where(ar == BLOCK_N - 1, idx, 0), 0)
    return full & (last - first == BLOCK_N - 1), first


@interpreted
def test_contig_run_negative_controls(monkeypatch):
    """The contiguous-run load is exercised and its check matters: a planted off-by-one in the run's
    first row, or a check of the two ends only, fails against the reference."""
    from harness.kernels import fused_mla_decode as fm

    lens = [64, 48, 17]
    q_nope, q_pe, pool, indptr, indices = problem(lens, 8, rows=64 * 8, seed=13)
    indices = paged(lens, 64 * 8, seed=14)
    holed = indices.clone()
    inner = torch.tensor([5, 20, 37, 70, 90])  # rows inside runs replaced: each run's ends still agree
    holed[inner] = (indices[inner] + 200) % (64 * 8)
    config = fm.Config(2, 16, contig=True)

    for idx in (indices, holed):
        ref_out, _ = reference(q_nope, q_pe, pool, indptr, idx)
        assert norm_rel(kernel(q_nope, q_pe, pool, indptr, idx, config)[0], ref_out) < 3e-3
    for bad, idx in ((_contig_off_by_one, indices), (_contig_ends_only, holed)):
        monkeypatch.setattr(fm, "_contig_run", bad)
        ref_out, _ = reference(q_nope, q_pe, pool, indptr, idx)
        assert norm_rel(kernel(q_nope, q_pe, pool, indptr, idx, config)[0], ref_out) > 4e-3, bad
        monkeypatch.undo()


@interpreted
def test_page_size_64_pool_rows():
    """Token-level indices address a pool of slots + 64 rows (page_size 64) up to its last row."""
    from harness.kernels.fused_mla_decode import Config

    q_nope, q_pe, pool, indptr, indices = problem([70, 9], 8, rows=256 + 64, seed=4)
    indices[:64] = torch.arange(256, 320, dtype=torch.int32)
    ref_out, _ = reference(q_nope, q_pe, pool, indptr, indices)
    out, _ = kernel(q_nope, q_pe, pool, indptr, indices, Config(2, 32))
    assert norm_rel(out, ref_out) < 3e-3


@interpreted
@pytest.mark.parametrize("case_name", ["glm5-tp8.ci.multistep-reuse"])
@pytest.mark.parametrize("forced", [None, dict(num_splits=2, block_n=16, dv_split=2, contig=True, pv_fp16=True),
                                    dict(num_splits=2, block_n=64, pv_fp16=True, tokens_m=True)])
def test_runner_goldens(case_name, forced, monkeypatch):
    """Slot reuse, several steps, short requests: the ci goldens pass, dropping the last token fails
    (with the tuned Config, and with the split kernel forced)."""
    if forced is not None:
        from harness.kernels import fused_tuning
        from harness.kernels.fused_mla_decode import Config

        monkeypatch.setattr(fused_tuning, "choose", lambda *a, **k: Config(**forced))
    outputs, verdict = run_strategies(case_name, ("fused_fp8",))["fused_fp8"]
    assert verdict.passed, verdict.reason
    faulty = run_strategies(case_name, ("fused_fp8",), faults=frozenset([Fault.DROPPED_LAST_TOKEN]))
    assert not faulty["fused_fp8"][1].passed


@interpreted
def test_scale_error_fault_fires_in_fused_fp8():
    """fused_fp8 claims scale-error-1pct (register(faults=...)), so the session hands it the fault: its
    1% KV-scale branch runs and the verdict turns red (it was dead while only native_fp8 claimed it)."""
    case_name = "glm5-tp8.ci.multistep-reuse"
    faulty = run_strategies(case_name, ("fused_fp8",), faults=frozenset([Fault.SCALE_ERROR]))["fused_fp8"][1]
    assert not faulty.passed and "norm-relative error" in faulty.reason, faulty.reason


@interpreted
def test_session_asserts_fused_fp8_dtype_contract(monkeypatch):
    """fused_fp8 overrides attend, yet the decode session asserts its dtype contract after every attend:
    the clean run hands e4m3 KV (else it would be an error), and an output of the wrong dtype is an
    error verdict naming the contract."""
    from rich.console import Console

    from harness.api import RunConfig, run
    from harness.inputs.cases import load_case
    from harness.kernels import fused_mla_decode as fmd

    real = fmd.fused_mla_decode

    def float16_out(*args, **kwargs):
        out, lse = real(*args, **kwargs)
        return out.to(torch.float16), lse

    monkeypatch.setattr(fmd, "fused_mla_decode", float16_out)
    cfg = RunConfig(case=load_case("glm5-tp8.ci.b1-l500"), device=torch.device("cpu"), backend="torch",
                    strategies=("fused_fp8",), repeats=0)
    verdict = next(r for r in run(cfg, Console(quiet=True)).results if r.strategy == "fused_fp8").verdict
    assert verdict.status.value == "error" and "fused_fp8 dtype contract: output is torch.float16" in verdict.reason


def test_fused_fp8_hands_attention_its_declared_kv_dtype():
    """What the session checks fused_fp8 against: e4m3 KV (the pool's bytes, viewed), as declared."""
    from harness.execute.prepared import PreparedCase
    from harness.inputs.cases import load_case
    from harness.verify.check import KV_CONTRACT

    assert KV_CONTRACT["fused_fp8"] == torch.float8_e4m3fn
    prep = PreparedCase(load_case("glm5-tp8.ci.b1-l500"), torch.device("cpu")).build()
    with prep.session("fused_fp8") as session:
        ckv, kpe = session.strategy.prepare_kv(0)
    assert ckv.dtype == kpe.dtype == torch.float8_e4m3fn and ckv.shape[-1] == 512 and kpe.shape[-1] == 64


def test_unsupported_on_cpu_without_interpreter():
    from harness.backends import make_backend
    from harness.strategies import REGISTRY

    reason = REGISTRY["fused_fp8"].unsupported_reason(torch.device("cpu"), make_backend("torch", torch.device("cpu")))
    assert (reason is None) == INTERPRETED
    assert INTERPRETED or "TRITON_INTERPRET=1" in reason


def test_tuning_table_and_default(tmp_path):
    from harness.kernels import fused_tuning
    from harness.kernels.fused_mla_decode import Config

    table = fused_tuning.load_table()
    assert (32, 4096) in table and (1, 4096) in table  # the committed H200 table covers the headline shapes
    assert fused_tuning.choose(32, 4097, 8, 132, cuda_smem=232448) == table[(32, 4096)]  # nearest power-of-two bucket
    assert fused_tuning.bucket(500) == 512 and fused_tuning.bucket(1) == 1 and fused_tuning.bucket(2800) == 2048
    # no entry: the heuristic fills one wave of 2 programs per SM, no split under 64 rows
    assert fused_tuning.choose(32, 4096, 8, 132, table={}) == Config(num_splits=8)
    assert fused_tuning.choose(256, 100, 8, 132, table={}) == Config(num_splits=1)
    assert fused_tuning.choose(3, 300, 8, 132, table={}) == Config(4, block_n=64, num_warps=8, pv_fp16=True)
    with pytest.raises(ValueError):
        Config(2, dv_split=3)
    with pytest.raises(ValueError):
        Config(2, dv_split=2, reload_v=True)
    assert Config(2, contig=True).split_kernel and not Config(2, reload_v=True).split_kernel
    for other in (dict(reload_v=True), dict(prefetch=True), dict(dv_split=2), dict(contig=True)):
        with pytest.raises(ValueError, match="tokens_m"):
            Config(2, 64, tokens_m=True, **other)
    good = tmp_path / "tokm.toml"
    good.write_text("[[entry]]\nbatch = 32\nkv_len = 4096\nnum_splits = 4\nblock_n = 64\nnum_warps = 4\n"
                    "num_stages = 5\npv_fp16 = true\ntokens_m = true\n")
    assert fused_tuning.load_table(good)[(32, 4096)] == Config(4, 64, 4, 5, pv_fp16=True, tokens_m=True)
    bad = tmp_path / "t.toml"
    bad.write_text("[[entry]]\nbatch = 3\nkv_len = 4096\nnum_splits = 2\nblock_n = 32\nnum_warps = 4\nnum_stages = 2\n")
    with pytest.raises(HarnessError, match="entry\\[0\\]"):
        fused_tuning.load_table(bad)
    # every entry field is a Config field or the key, of its type, the required ones present: a misspelt field, a
    # string or integer for a boolean and a missing ring depth are named, not read as their defaults
    entry = good.read_text()
    for text, error in ((entry + "ping_pnog = true\n", "ping_pnog: not a field"), (entry.replace("true", '"true"', 1), "pv_fp16: must be true"),
                        (entry.replace("pv_fp16 = true", "pv_fp16 = 1"), "pv_fp16: must be true"),
                        (entry.replace("num_stages = 5\n", ""), "num_stages: missing")):
        bad.write_text(text)
        with pytest.raises(HarnessError, match=f"entry\\[0\\]\\.{error}"):
            fused_tuning.load_table(bad)


def test_cuda_kernel_config_and_table(tmp_path):
    """Config.cuda (the CUDA kernel): its fields are checked (pdl_merge and cluster_merge only with
    cuda), the table reads them, choose() falls back where it cannot run (no cuda_smem), its ring does
    not fit (sm_120), keeping the merge, or clusters are missing (the CTA merge), and it refuses the CPU."""
    from harness.kernels import fused_mla_cuda, fused_tuning
    from harness.kernels.fused_mla_decode import Config, fused_mla_decode, partial_buffers

    Config(4, 64, 8, 4, pv_fp16=True, cuda=True)
    Config(4, 64, 16, 2, pv_fp16=True, cuda=True, pdl_merge=True)
    with pytest.raises(ValueError, match="pdl_merge"):
        Config(4, 64, 8, 2, pv_fp16=True, pdl_merge=True)
    # cluster_merge: CUDA only, one portable cluster of 2, 4 or 8 splits, not with pdl_merge
    assert Config(8, 64, 8, 2, pv_fp16=True, cuda=True, cluster_merge=True).merge_by == "cluster"
    for bad in (dict(num_splits=3), dict(num_splits=16), dict(pdl_merge=True), dict(cuda=False, num_stages=2)):
        with pytest.raises(ValueError, match="cluster_merge"):
            Config(**(dict(num_splits=4, block_n=64, num_warps=8, num_stages=4, pv_fp16=True, cuda=True,
                           cluster_merge=True) | bad))
    # grid_merge: CUDA only, not with another merge; a launch past one wave or whose splits do not divide 128 merges
    # the last-CTA way
    assert Config(32, 64, 16, 3, pv_fp16=True, cuda=True, grid_merge=True).merge_by == "grid"
    for bad in (dict(pdl_merge=True), dict(cluster_merge=True, num_splits=4), dict(cuda=False, num_stages=2)):
        with pytest.raises(ValueError, match="grid_merge"):
            Config(**(dict(num_splits=4, block_n=64, num_warps=8, num_stages=4, pv_fp16=True, cuda=True,
                           grid_merge=True) | bad))
    assert fused_mla_cuda.grid_merges(32, 32, 132) and fused_mla_cuda.grid_merges(128, 128, 132)
    assert not fused_mla_cuda.grid_merges(32, 288, 132)  # two waves: the first would wait for the second forever
    assert not fused_mla_cuda.grid_merges(3, 3, 132) and not fused_mla_cuda.grid_merges(1, 1, 132)
    for bad in (dict(block_n=32), dict(num_warps=4), dict(pv_fp16=False), dict(num_stages=6), dict(reload_v=True),
                dict(dv_split=2), dict(tokens_m=True)):
        fields = dict(num_splits=4, block_n=64, num_warps=8, num_stages=4, pv_fp16=True, cuda=True) | bad
        with pytest.raises(ValueError):
            Config(**fields)
    path = tmp_path / "cuda.toml"
    path.write_text("[[entry]]\nbatch = 32\nkv_len = 4096\nnum_splits = 8\nblock_n = 64\nnum_warps = 8\n"
                    "num_stages = 2\npv_fp16 = true\ncuda = true\n\n[[entry]]\nbatch = 8\nkv_len = 4096\nnum_splits = 8\n"
                    "block_n = 64\nnum_warps = 8\nnum_stages = 2\npv_fp16 = true\ncuda = true\npdl_merge = true\n")
    table = fused_tuning.load_table(path)
    assert table[(32, 4096)] == Config(8, 64, 8, 2, pv_fp16=True, cuda=True)
    assert table[(8, 4096)] == Config(8, 64, 8, 2, pv_fp16=True, cuda=True, pdl_merge=True)
    h200, sm120 = 232448, 101376  # shared memory per block (opt-in)
    assert fused_tuning.choose(32, 4096, 8, 132, table=table, cuda_smem=h200) == table[(32, 4096)]
    assert fused_tuning.choose(32, 4096, 8, 132, table=table) == fused_tuning.default_config(32, 4096, 8, 132)
    # a cluster entry round-trips through the table; without clusters (sm_89) its splits get the CTA merge
    clustered = tmp_path / "cluster.toml"
    clustered.write_text(path.read_text().replace("cuda = true\n\n", "cuda = true\ncluster_merge = true\n\n", 1))
    cluster_table = fused_tuning.load_table(clustered)
    assert cluster_table[(32, 4096)] == Config(8, 64, 8, 2, pv_fp16=True, cuda=True, cluster_merge=True)
    assert fused_tuning.choose(32, 4096, 8, 132, table=cluster_table, cuda_smem=h200) == cluster_table[(32, 4096)]
    assert fused_tuning.choose(32, 4096, 8, 132, table=cluster_table, cuda_smem=h200, clusters=False) == table[(32, 4096)]
    deep = {(32, 4096): Config(8, 64, 16, 4, pv_fp16=True, cuda=True, pdl_merge=True)}
    assert fused_tuning.choose(32, 4096, 8, 132, table=deep, cuda_smem=h200) == deep[(32, 4096)]
    # sm_120: the 4-stage ring does not fit 99 KB; 8 heads fall back to the 2-stage 8-warp ring, 16 to Triton
    assert fused_tuning.choose(32, 4096, 8, 188, table=deep, cuda_smem=sm120) == Config(8, 64, 8, 2, pv_fp16=True, cuda=True,
                                                                                          pdl_merge=True)
    assert fused_tuning.choose(32, 4096, 16, 188, table=deep, cuda_smem=sm120) == fused_tuning.default_config(32, 4096, 16, 188)
    # a ping_pong entry round-trips; on sm_120 (two 2-stage rings do not fit 99 KB) it falls back to one ring of 8 warps
    pp_path = tmp_path / "pp.toml"
    pp_path.write_text(path.read_text().replace("num_warps = 8\nnum_stages = 2\npv_fp16 = true\ncuda = true\n\n",
                                                "num_warps = 16\nnum_stages = 2\npv_fp16 = true\ncuda = true\nping_pong = true\n\n", 1))
    pp = fused_tuning.load_table(pp_path)
    assert pp[(32, 4096)] == Config(8, 64, 16, 2, pv_fp16=True, cuda=True, ping_pong=True)
    assert fused_tuning.choose(32, 4096, 8, 132, table=pp, cuda_smem=h200) == pp[(32, 4096)]
    assert fused_tuning.choose(32, 4096, 8, 188, table=pp, cuda_smem=sm120) == Config(8, 64, 8, 2, pv_fp16=True, cuda=True)
    q_nope, q_pe = torch.zeros(1, 8, 512, dtype=torch.bfloat16), torch.zeros(1, 8, 64, dtype=torch.bfloat16)
    pool = torch.zeros(4, 1, 576, dtype=torch.uint8)
    with pytest.raises(ValueError, match="CUDA device"):
        fused_mla_decode(q_nope, q_pe, pool[..., :512], pool[..., 512:], torch.tensor([0, 2], dtype=torch.int32),
                         torch.tensor([1, 2], dtype=torch.int32), 0.1, table[(32, 4096)])
    # partials: fp16 part_out for the CUDA kernel, fp32 for Triton; the wrong one is refused (planted twin)
    cuda_cfg, triton_cfg = table[(32, 4096)], fused_tuning.default_config(32, 4096, 8, 132)
    assert partial_buffers(1, 8, cuda_cfg, 512, "cpu")[0].dtype == torch.float16
    assert partial_buffers(1, 8, dataclasses.replace(triton_cfg, num_splits=2), 512, "cpu")[0].dtype == torch.float32
    wrong = partial_buffers(1, 8, dataclasses.replace(cuda_cfg, cuda=False, num_stages=2), 512, "cpu")
    with pytest.raises(ValueError, match="part_out is torch.float32"):
        fused_mla_decode(q_nope, q_pe, pool[..., :512], pool[..., 512:], torch.tensor([0, 2], dtype=torch.int32),
                         torch.tensor([1, 2], dtype=torch.int32), 0.1, cuda_cfg, partials=wrong)
    # shared memory: 8 heads, 2 stages, 8 warps fit a 99 KB (sm_120) CTA; the deep rings need an H100/H200-class one
    smem = lambda *a: fused_mla_cuda.Instance(*a).smem  # noqa: E731
    assert smem(8, 2, 8) <= 99 * 1024 < smem(8, 4, 8) <= 227 * 1024
    assert smem(16, 5, 16) <= 227 * 1024
    # ping_pong: two rings of 2, per-group index rings and softmax buffers; two rings of 3 would not fit
    assert smem(16, 2, 16, True) <= 227 * 1024 < smem(16, 2, 16, True) + 2 * 64 * 576
    assert smem(8, 2, 16, True) - smem(8, 2, 16) == 2 * 64 * 576 + 16 * 64 * 4 + 8 * 72 * 2 + 3 * 8 * 4
    for bad in (dict(num_warps=8, ping_pong=True), dict(num_warps=16, num_stages=3, ping_pong=True)):
        with pytest.raises(ValueError, match="ping_pong"):
            dataclasses.replace(cuda_cfg, **bad)
    assert fused_mla_cuda.heads_per_cta(8) == 8 and fused_mla_cuda.heads_per_cta(9) == 16


def test_every_search_times_the_committed_entry():
    """`python -m ci.experiments.tune_fused` times the committed table entry of a shape beside any search's candidates,
    and --search tokens_m stays small enough for one ~250 s tuner run per shape."""
    from ci.experiments.tune_fused import tune_fused as tune
    from harness.kernels import fused_tuning

    table = fused_tuning.load_table()
    for batch, kv_len in ((32, 4096), (128, 2048)):
        for search in ("tiles", "split", "tokens_m", "cuda"):
            space = tune.search_space(search, batch, kv_len, 8, 132)
            assert space[0] == table[(batch, kv_len)] and len(space) == len(set(space))
        space = tune.search_space("tokens_m", batch, kv_len, 8, 132)
        assert len(space) <= 24 and sum(c.tokens_m for c in space) >= len(space) // 2


def test_an_entry_for_a_head_count_wins_for_those_heads_only(tmp_path):
    """heads = 16 (DeepSeek-V3's 16 heads per rank) is chosen for 16 heads; 8 heads keep the entry without
    heads (twin); a second entry for the same key is refused."""
    from harness.kernels import fused_tuning
    from harness.kernels.fused_mla_decode import Config

    entry = "[[entry]]\nbatch = 32\nkv_len = 4096\n{}num_splits = {}\nblock_n = 64\nnum_warps = 8\nnum_stages = 2\n" \
            "pv_fp16 = true\ncuda = true\n"
    path = tmp_path / "heads.toml"
    path.write_text(entry.format("", 8) + "\n" + entry.format("heads = 16\n", 4))
    table = fused_tuning.load_table(path)
    h200 = 232448
    assert fused_tuning.choose(32, 4096, 16, 132, table=table, cuda_smem=h200) == Config(4, 64, 8, 2, pv_fp16=True, cuda=True)
    assert fused_tuning.choose(32, 4096, 8, 132, table=table, cuda_smem=h200) == Config(8, 64, 8, 2, pv_fp16=True, cuda=True)
    twice = tmp_path / "twice.toml"
    twice.write_text(entry.format("heads = 16\n", 8) + "\n" + entry.format("heads = 16\n", 4))
    with pytest.raises(HarnessError, match="entry\\[1\\].*second entry for batch 32, kv_len 4096, heads 16"):
        fused_tuning.load_table(twice)


def test_the_tuner_replaces_its_own_entries_and_keeps_the_rest(tmp_path):
    """write_table: the tuned shapes' entries (for the preset's heads) replace those with the same key; every
    other entry of the file is kept as written, comments included."""
    from ci.experiments.tune_fused import tune_fused as tune
    from harness.kernels import fused_tuning
    from harness.kernels.fused_mla_decode import Config

    path = tmp_path / "table.toml"
    path.write_text(fused_tuning.TABLE_FILE.read_text())
    before = fused_tuning.load_table(path)
    tuned = Config(4, 64, 8, 2, pv_fp16=True, cuda=True)
    entries = [dict(batch=32, kv_len=4096, heads=16, best_us=40.0, floor_us=18.0, config=tuned.__dict__)]
    tune.write_table(path, entries, "H200", "deepseek-v3-tp8")
    after = fused_tuning.load_table.__wrapped__(path)
    assert after[(32, 4096, 16)] == tuned and {k: v for k, v in after.items() if k != (32, 4096, 16)} == {
        k: v for k, v in before.items() if k != (32, 4096, 16)}
    text = path.read_text()
    assert text.startswith("# Fused FP8 MLA decode launch table") and "# 5.1 us/layer" in text
    assert "deepseek-v3-tp8 on H200: 40.0 us/layer" in text
    tune.write_table(path, [dict(entries[0], best_us=39.0, config=Config(2, 64, 8, 2, pv_fp16=True, cuda=True).__dict__)],
                     "H200", "deepseek-v3-tp8")
    again = fused_tuning.load_table.__wrapped__(path)
    assert again[(32, 4096, 16)].num_splits == 2 and len(again) == len(after)  # replaced, not appended


def test_an_entry_for_a_gpu_wins_on_that_gpu_only(tmp_path):
    """gpu = "NVIDIA H200" is chosen on a GPU of that name (apart from case and spacing), for any heads that have no
    entry of their own; an H100 keeps the entry without gpu (twin); an entry for these heads beats one of this GPU; a
    gpu that is no name, or a second entry for the same GPU spelled otherwise, is refused naming the entry."""
    from harness.kernels import fused_tuning
    from harness.kernels.fused_mla_decode import Config

    entry = "[[entry]]\nbatch = 32\nkv_len = 4096\n{}num_splits = {}\nblock_n = 64\nnum_warps = 8\nnum_stages = 2\npv_fp16 = true\ncuda = true\n"
    path = tmp_path / "gpu.toml"
    path.write_text("\n".join([entry.format("", 8), entry.format('gpu = "NVIDIA H200"\n', 4), entry.format("heads = 16\n", 2)]))
    table = fused_tuning.load_table(path)
    splits = {gpu: fused_tuning.choose(32, 4096, heads, 132, table=table, cuda_smem=232448, gpu=gpu).num_splits
              for gpu, heads in (("NVIDIA H200", 8), ("nvidia  h200", 8), ("NVIDIA H100 80GB HBM3", 8), (None, 8))}
    assert splits == {"NVIDIA H200": 4, "nvidia  h200": 4, "NVIDIA H100 80GB HBM3": 8, None: 8}
    assert fused_tuning.choose(32, 4096, 16, 132, table=table, cuda_smem=232448, gpu="NVIDIA H200") == Config(2, 64, 8, 2, pv_fp16=True, cuda=True)
    for bad, message in (("gpu = 200\n", "gpu: must be a GPU name, got 200"), ('gpu = " "\n', "gpu a name")):
        path.write_text(entry.format(bad, 4))
        with pytest.raises(HarnessError, match=message):
            fused_tuning.load_table.__wrapped__(path)
    path.write_text(entry.format('gpu = "NVIDIA H200"\n', 4) + "\n" + entry.format('gpu = "nvidia h200"\n', 2))
    with pytest.raises(HarnessError, match="entry\\[1\\].*second entry for batch 32, kv_len 4096, gpu nvidia h200"):
        fused_tuning.load_table.__wrapped__(path)


def test_the_tuner_writes_entries_for_its_gpu_alone_when_asked(tmp_path):
    """write_table(gpu=...) writes the tuned shapes as that GPU's entries: they replace that GPU's, and the entries
    without gpu (other GPUs') stay as they were."""
    from ci.experiments.tune_fused import tune_fused as tune
    from harness.kernels import fused_tuning
    from harness.kernels.fused_mla_decode import Config

    path = tmp_path / "table.toml"
    path.write_text(fused_tuning.TABLE_FILE.read_text())
    before = fused_tuning.load_table(path)
    key = (32, 4096, 8, "nvidia h200")
    for splits in (4, 2):
        tuned = Config(splits, 64, 16, 2, pv_fp16=True, cuda=True, ping_pong=True)
        entries = [dict(batch=32, kv_len=4096, heads=8, best_us=25.0, floor_us=18.0, config=tuned.__dict__)]
        tune.write_table(path, entries, "NVIDIA H200", "glm5-tp8", gpu="NVIDIA H200")
        after = fused_tuning.load_table.__wrapped__(path)
        assert after[key] == tuned and {k: v for k, v in after.items() if k != key} == before
    assert 'gpu = "NVIDIA H200"' in path.read_text()


def test_roofline_bytes():
    from harness.inputs.cases import load_case
    from harness.results import roofline

    case = load_case("glm5-tp8.prod.b32-l4096")
    geometry = case.geometry
    last = case.schedule().steps[-1]
    fused = roofline.step_bytes("fused_fp8", geometry, last, 8)
    shadow = roofline.step_bytes("shadow", geometry, last, 8)
    kv = len(last.kv_indices) * 576
    assert fused.cast == 0 and kv < fused.attn < kv * 1.01  # the FP8 rows once, plus queries and outputs
    assert shadow.attn - shadow.layer + shadow.write == 0 and 2 * kv < shadow.attn < 2 * kv * 1.01
    assert shadow.write == 3 * fused.write
    assert fused.step == fused.layer * 78
    # the floor: 78 x 75.5 MB at 4.27 TB/s = 1.4 ms
    assert 1.35e3 < roofline.floor_us(fused.step, 4270) < 1.45e3
    stock = roofline.step_bytes("stock", geometry, last, 8)
    assert stock.cast == geometry.layer_bytes * 3


def test_pdl_launch_structs_match_cuda_h():
    """The ctypes mirrors of CUlaunchAttribute / CUlaunchConfig that fused_mla_cuda hands to
    cuLaunchKernelEx have cuda.h's layout (CUDA 13.0: sizeof and offsetof printed from the header)
    and the programmatic-stream-serialization attribute id."""
    import ctypes

    from harness.kernels import fused_mla_cuda as fc

    assert (ctypes.sizeof(fc._LaunchAttribute), fc._LaunchAttribute.value.offset) == (72, 8)
    cfg = fc._LaunchConfig
    assert (ctypes.sizeof(cfg), cfg.shared_mem.offset, cfg.stream.offset, cfg.attrs.offset, cfg.num_attrs.offset) == (
        56, 24, 32, 40, 48)
    assert fc._PDL_ATTRIBUTE == 6
    two = fc._launch_config((8, 30, 1), 256, 1000, ((fc._CLUSTER_ATTRIBUTE, (8, 1, 1)), *fc._PDL), None)
    assert two.num_attrs == 2 and [(two.attrs[i].id, two.attrs[i].value[0]) for i in range(2)] == [(4, 8), (6, 1)]


def test_wave_split_runs_what_one_wave_of_clusters_leaves_beside_it():
    """A cluster merge whose clusters do not all fit at once keeps one wave of them and runs the
    other requests beside it over the CTA slots left free (b32-l4096 on an H200: 30 clusters of 8
    of 264 slots, so 2 requests of 12 splits), never more splits than the partial buffers hold and
    never fewer than the clusters' own (else the clusters all go in one launch, two waves)."""
    from harness.kernels.fused_mla_cuda import MAX_REST_SPLITS, wave_split

    assert wave_split(32, 1, 8, 30, 264) == (30, 12)
    assert wave_split(30, 1, 8, 30, 264) == (30, 0) and wave_split(1, 1, 8, 30, 264) == (1, 0)
    assert wave_split(31, 1, 8, 30, 264) == (30, MAX_REST_SPLITS)
    assert wave_split(40, 1, 8, 30, 264) == (40, 0)  # 10 requests at 2 splits would finish last
    assert wave_split(33, 1, 8, 30, 264) == (30, 8) and wave_split(34, 1, 8, 30, 264) == (34, 0)
    assert wave_split(16, 2, 8, 30, 264) == (15, 12)  # two head groups: two clusters a request
    assert wave_split(200, 1, 2, 132, 264) == (200, 0)  # no slot left
    assert wave_split(5, 1, 8, 0, 264) == (0, 8)  # no cluster fits: all of it, as many splits as its partials hold
    assert wave_split(3, 1, 2, 2, 10_000) == (2, 6)  # what partials for 3 x 2 splits hold


def _define_mismatches(source: str) -> list[str]:
    """Constants fused_mla_cuda.py mirrors from the .cu file's #defines that disagree with them."""
    import re

    from harness.kernels import fused_mla_cuda as fc

    defines = {k: int(v) for k, v in re.findall(r"^#define (\w+) (\d+)", source, flags=re.M)}
    mirrored = dict(TILE=fc.TILE, ROW=fc.ROW, QROW=fc.QROW, SROW=fc.SROW, PROW=fc.PROW, IR=fc.IR, BARS=fc.BARS,
                    D_CKV=fc.D_CKV, WAIT_PRIOR=fc.WAIT_PRIOR, INDICES_READY=fc.INDICES_READY,
                    MERGE_KERNEL=fc.MERGES.index("kernel"), MERGE_CTA=fc.MERGES.index("cta"),
                    MERGE_CLUSTER=fc.MERGES.index("cluster"), CLUSTER_MAX=max(fc.CLUSTER_SPLITS))
    return [k for k, v in mirrored.items() if defines.get(k) != v]


def test_python_mirrors_the_kernel_defines():
    """smem_bytes, the merge flags and the cluster sizes use the .cu file's #defines; a planted edit
    of one (PROW 72 -> 64) is seen."""
    from harness.kernels import fused_mla_cuda as fc

    source = fc.SOURCE.read_text()
    assert _define_mismatches(source) == []
    assert _define_mismatches(source.replace("#define PROW 72", "#define PROW 64")) == ["PROW"]


def test_fused_fp8_tells_the_kernel_which_rows_the_step_writes(monkeypatch):
    """The CUDA kernel loads rows before it waits for the step's previous kernel, all but each request's last
    `new_tokens` (fused_mla_cuda.decode): fused_fp8 must pass as many as the step writes per request, and the
    rows it writes must be those last ones, in every step of a schedule that reuses freed slots."""
    from harness.execute.prepared import PreparedCase
    from harness.inputs.cases import load_case
    from harness.kernels import fused_mla_decode as fmd

    calls = []

    def record(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, *args, **kwargs):
        calls.append((kv_indptr.clone(), kv_indices.clone(), kwargs))
        return torch.zeros(*q_nope.shape, dtype=torch.bfloat16), torch.zeros(q_nope.shape[:2])

    monkeypatch.setattr(fmd, "fused_mla_decode", record)
    prep = PreparedCase(load_case("glm5-tp8.ci.multistep-reuse"), torch.device("cpu")).build()
    with prep.session("fused_fp8") as session:
        assert len(session.schedule.steps) > 1 and any(len(b.reused_slots) for b in session.schedule.steps)
        for batch in session.schedule.steps:
            q = session.data.steps[batch.step]
            session.strategy.attend(session.strategy.begin_step(batch), q.q_nope[0], q.q_pe[0], session.strategy.prepare_kv(0))
            indptr, indices, kwargs = calls[-1]
            assert kwargs["indices_ready"] and kwargs["new_tokens"] == len(batch.write_slots) // batch.batch_size == 1
            assert indices[indptr[1:].long() - 1].tolist() == batch.write_slots.tolist()
