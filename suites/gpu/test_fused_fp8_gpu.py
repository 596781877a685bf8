"""fused_fp8 on a CUDA GPU: production goldens, negative controls, hidden-style shapes against a
float64 reference, NaN propagation, CUDA-graph re-planning, pools with page_size 64 rows."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch

from harness.execute.decode import DecodeSession, make_step_data
from harness.inputs.cases import golden_case_names, load_case
from harness.inputs.pool import KVPool
from harness.spec.faults import Fault
from suites.helpers import run_strategies

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                       reason="TRITON_INTERPRET=1: these tests need compiled kernels"),
]

PROD_CASES = [n for n in golden_case_names() if ".prod." in n]
SM_SCALE = 1 / math.sqrt(192)


def reference(q_nope, q_pe, pool, indptr, indices):
    """float64 absorbed-MLA decode: (out [B, H, 512], lse [B, H])."""
    kv = pool.reshape(pool.shape[0], -1).view(torch.float8_e4m3fn)
    outs, lses = [], []
    for b in range(q_nope.shape[0]):
        rows = kv[indices[indptr[b]:indptr[b + 1]].long()].double()
        logits = (q_nope[b].double() @ rows[:, :512].T + q_pe[b].double() @ rows[:, 512:].T) * SM_SCALE
        lse = torch.logsumexp(logits, -1)
        outs.append(torch.exp(logits - lse[:, None]) @ rows[:, :512])
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def problem(lens, heads, rows, seed=0, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    pool = torch.randint(0, 0x7E, (rows, 1, 576), generator=g, dtype=torch.uint8)
    pool |= torch.randint(0, 2, pool.shape, generator=g, dtype=torch.uint8) << 7  # both signs, no NaN
    pool[..., :512] = pool[..., :512] & 0xBF  # |value| < 2: logits of a realistic size
    pool[..., 512:] = pool[..., 512:] & 0xBF
    indices = torch.randint(0, rows, (sum(lens),), generator=g, dtype=torch.int32)
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    q_nope = torch.randn(len(lens), heads, 512, generator=g).to(torch.bfloat16)
    q_pe = torch.randn(len(lens), heads, 64, generator=g).to(torch.bfloat16)
    return [t.to(device) for t in (q_nope, q_pe, pool, indptr, indices)]


def run_kernel(q_nope, q_pe, pool, indptr, indices, config, kv_scale=1.0):
    from harness.kernels.fused_mla_decode import fused_mla_decode

    return fused_mla_decode(q_nope, q_pe, pool[..., :512], pool[..., 512:], indptr, indices, SM_SCALE, config,
                            kv_scale=kv_scale)


def norm_rel(out, ref):
    return float((out.double() - ref).norm() / ref.norm())


@pytest.mark.prod
@pytest.mark.parametrize("case_name", PROD_CASES)
def test_prod_goldens(case_name, gpu_device):
    results = run_strategies(case_name, ("fused_fp8",), device=gpu_device, backend="torch")
    verdict = results["fused_fp8"][1]
    assert verdict.passed, verdict.reason


@pytest.mark.prod
@pytest.mark.parametrize("fault, case_name", [(Fault.NAN_IN_POOL, "glm5-tp8.prod.b1-l500"),
                                              (Fault.DROPPED_LAST_TOKEN, "glm5-tp8.prod.b1-l500"),
                                              (Fault.DROPPED_LAST_TOKEN, "glm5-tp8.prod.multistep-reuse")])
def test_negative_controls(fault, case_name, gpu_device):
    outputs, verdict = run_strategies(case_name, ("fused_fp8",), device=gpu_device, backend="torch",
                                      faults=frozenset([fault]))["fused_fp8"]
    assert not verdict.passed, f"{fault.value} went unnoticed"
    if fault is Fault.NAN_IN_POOL:
        assert verdict.stats is not None and verdict.stats.nonfinite > 0 or "NaN" in verdict.reason or "non-finite" in verdict.reason


# The tokens-as-M (wgmma) kernel: the --search tokens_m tiles, direct and split, fp16 and hi + lo P.V.
TOKENS_M_FIELDS = [dict(num_splits=4, block_n=64, num_stages=3, pv_fp16=True),
                   dict(num_splits=1, block_n=64, num_stages=5, pv_fp16=True),
                   dict(num_splits=3, block_n=64, num_warps=8, num_stages=3, pv_fp16=True),
                   dict(num_splits=2, block_n=128, num_warps=8, num_stages=3, pv_fp16=True),
                   dict(num_splits=5, block_n=64, num_stages=3)]


def tokens_m_configs(*which):
    from harness.kernels.fused_mla_decode import Config

    return [Config(**TOKENS_M_FIELDS[i], tokens_m=True) for i in (which or range(len(TOKENS_M_FIELDS)))]


# The CUDA kernel (Config.cuda): direct and split (each in-kernel merge and the merge kernel), 8 and 16 warps,
# ring depths 2-5; then two groups of 8 warps streaming alternate tiles (ping_pong) under each merge.
CUDA_FIELDS = [dict(num_splits=1, num_warps=8, num_stages=4), dict(num_splits=3, num_warps=8, num_stages=2),
               dict(num_splits=5, num_warps=16, num_stages=4), dict(num_splits=64, num_warps=16, num_stages=3),
               dict(num_splits=8, num_warps=8, num_stages=5), dict(num_splits=3, num_warps=8, num_stages=2, pdl_merge=True),
               dict(num_splits=64, num_warps=16, num_stages=3, pdl_merge=True),
               dict(num_splits=8, num_warps=8, num_stages=2, cluster_merge=True),
               dict(num_splits=2, num_warps=16, num_stages=4, cluster_merge=True),
               dict(num_splits=4, num_warps=8, num_stages=2, grid_merge=True),
               dict(num_splits=16, num_warps=8, num_stages=2, grid_merge=True),
               dict(num_splits=32, num_warps=8, num_stages=3, grid_merge=True),
               dict(num_splits=1, num_warps=16, num_stages=2, ping_pong=True),
               dict(num_splits=3, num_warps=16, num_stages=2, ping_pong=True),
               dict(num_splits=2, num_warps=16, num_stages=2, ping_pong=True, cluster_merge=True),
               dict(num_splits=8, num_warps=16, num_stages=2, ping_pong=True, grid_merge=True),
               dict(num_splits=3, num_warps=16, num_stages=2, ping_pong=True, pdl_merge=True)]


def cuda_configs(*which):
    from harness.kernels.fused_mla_decode import Config

    return [Config(block_n=64, pv_fp16=True, cuda=True, **CUDA_FIELDS[i]) for i in (which or range(len(CUDA_FIELDS)))]


@pytest.mark.parametrize("heads", [8, 16, 20])
@pytest.mark.parametrize("lens", [[1], [2], [1, 2, 3, 5, 7, 11, 13], [997, 1, 4099], [31] * 9])
def test_hidden_shapes_against_float64(lens, heads):
    from harness.kernels.fused_mla_decode import Config

    q_nope, q_pe, pool, indptr, indices = problem(lens, heads, rows=5000)
    ref_out, ref_lse = reference(q_nope.cpu(), q_pe.cpu(), pool.cpu(), indptr.cpu(), indices.cpu())
    for config in (Config(1, 16), Config(3, 32, 8, 1), Config(8, 64, 4, 2), Config(64, 32),
                   Config(3, 32, 8, 2, reload_v=True), Config(5, 64, 4, 2, pv_fp16=True),
                   Config(1, 32, 4, 2, reload_v=True, pv_fp16=True), Config(7, 32, prefetch=True),
                   Config(2, 64, 8, 2, pv_fp16=True, prefetch=True),
                   Config(8, 32, 4, 4, reload_v=True, pv_fp16=True), Config(2, 32, 4, 3, reload_v=True, pv_fp16=True),
                   Config(4, 32, 4, 5, reload_v=True, pv_fp16=True), Config(1, 32, 4, 5, pv_fp16=True, contig=True),
                   Config(4, 32, 4, 5, pv_fp16=True, dv_split=2), Config(3, 32, 4, 7, pv_fp16=True, dv_split=2),
                   Config(2, 32, 4, 5, pv_fp16=True, dv_split=4, contig=True), Config(5, 32, 4, 5, dv_split=2, qk_chunk=128),
                   *tokens_m_configs(), *cuda_configs()):
        out, lse = run_kernel(q_nope, q_pe, pool, indptr, indices, config)
        assert norm_rel(out.cpu(), ref_out) < 3e-3, config
        assert float((lse.cpu().double() - ref_lse).abs().max()) < 1e-3, config
    # negative control: one token dropped from the last request must show
    short = indptr.clone()
    short[-1] -= 1
    for config in (Config(3, 32), *cuda_configs(1)):
        dropped, _ = run_kernel(q_nope, q_pe, pool, short, indices, config)
        if lens[-1] <= 100:  # one token of thousands moves the output less than the tolerance
            assert norm_rel(dropped[-1:].cpu(), ref_out[-1:]) > 3e-3, config


@pytest.mark.parametrize("code", [0x7F, 0xFF])
@pytest.mark.parametrize("channel", [0, 300, 511, 512, 575])
def test_nan_codes_propagate(code, channel):
    from harness.kernels.fused_mla_decode import Config

    q_nope, q_pe, pool, indptr, indices = problem([40, 300, 7], 8, rows=1000, seed=3)
    poisoned_row = int(indices[int(indptr[1]) + 123])
    pool[poisoned_row, 0, channel] = code
    others = [b for b in range(3) if poisoned_row not in indices[indptr[b]:indptr[b + 1]].tolist()]
    for config in (Config(1, 32), Config(5, 16), Config(5, 32, reload_v=True, pv_fp16=True),
                   Config(3, 16, pv_fp16=True, prefetch=True), Config(3, 32, 4, 5, pv_fp16=True, dv_split=4, contig=True),
                   Config(1, 32, 4, 5, dv_split=2, qk_chunk=128), *tokens_m_configs(0, 1, 4), *cuda_configs(0, 2, 12, 13)):
        out, lse = run_kernel(q_nope, q_pe, pool, indptr, indices, config)
        assert not bool(torch.isfinite(out[1]).all()) and not bool(torch.isfinite(lse[1]).all()), config
        for b in others:
            assert bool(torch.isfinite(out[b]).all()), (config, b)


def test_page_size_64_pool_rows():
    """A pool of slots + 64 rows (page_size 64): token-level indices reach every row, the last page too."""
    from harness.kernels.fused_mla_decode import Config

    slots, page = 4096, 64
    q_nope, q_pe, pool, indptr, indices = problem([100, 64, 129], 8, rows=slots + page, seed=5)
    indices[:64] = torch.arange(slots, slots + page, dtype=torch.int32, device="cuda")
    ref_out, ref_lse = reference(q_nope.cpu(), q_pe.cpu(), pool.cpu(), indptr.cpu(), indices.cpu())
    for config in (Config(4, 32), Config(4, 32, 4, 5, pv_fp16=True, dv_split=2, contig=True), *tokens_m_configs(0),
                   *cuda_configs(1)):
        out, lse = run_kernel(q_nope, q_pe, pool, indptr, indices, config)
        assert norm_rel(out.cpu(), ref_out) < 3e-3, config
        assert float((lse.cpu().double() - ref_lse).abs().max()) < 1e-3, config


@pytest.mark.parametrize("config_fields", [dict(num_splits=4, num_stages=5, pv_fp16=True, contig=True),
                                           dict(num_splits=1, num_stages=5, pv_fp16=True, dv_split=2, contig=True),
                                           *[dict(block_n=64, pv_fp16=True, cuda=True, **f) for f in
                                             (dict(num_splits=4, num_warps=8, num_stages=2),
                                              dict(num_splits=3, num_warps=8, num_stages=3, pdl_merge=True),
                                              dict(num_splits=1, num_warps=16, num_stages=4),
                                              dict(num_splits=2, num_warps=16, num_stages=2),
                                              dict(num_splits=4, num_warps=8, num_stages=2, cluster_merge=True),
                                              dict(num_splits=1, num_warps=16, num_stages=2, ping_pong=True),
                                              dict(num_splits=4, num_warps=16, num_stages=2, cluster_merge=True,
                                                   ping_pong=True))]])
def test_paged_indices_contiguous_runs(config_fields):
    """Page-contiguous indices (the contiguous-run load taken: Triton's contig tiles, the CUDA kernel's
    bulk copy of a page), the same rows with one index per run replaced by another request's row
    (runs and gathers mixed: the CUDA kernel's per-row bulk copies on sm_90+), and for the CUDA kernel
    the pages with ckv / kpe in separate buffers (cp.async gathers only), against the float64 reference. Each request's last page is NaN past its tokens:
    a run load copies only the valid rows and zeroes the rest, else P = 0 times NaN poisons the output."""
    from harness.kernels.fused_mla_decode import Config, fused_mla_decode

    page, lens = 64, [4099, 1, 200, 64, 31]
    q_nope, q_pe, pool, indptr, _ = problem(lens, 8, rows=page * 160, seed=7)
    g = torch.Generator().manual_seed(8)
    pages = torch.randperm(160, generator=g).tolist()
    rows = []
    for n in lens:
        need = -(-n // page)
        mine, pages = pages[:need], pages[need:]
        run = ((torch.tensor(mine) * page)[:, None] + torch.arange(page)).reshape(-1)
        pool[run[n:].cuda()] = 0x7F  # the last page's unused rows: NaN
        rows.append(run[:n])
    paged = torch.cat(rows).to(torch.int32)
    holed = paged.clone()
    holed[3::37] = paged.roll(1000)[3::37]
    config = Config(**config_fields)
    split_parts = (pool[..., :512].clone(), pool[..., 512:].clone())
    for indices, parts in ((paged, None), (holed, None), *([(paged, split_parts)] if config.cuda else [])):
        ref_out, ref_lse = reference(q_nope.cpu(), q_pe.cpu(), pool.cpu(), indptr.cpu(), indices)
        ckv, kpe = parts or (pool[..., :512], pool[..., 512:])
        out, lse = fused_mla_decode(q_nope, q_pe, ckv, kpe, indptr, indices.cuda(), SM_SCALE, config)
        assert norm_rel(out.cpu(), ref_out) < 3e-3
        assert float((lse.cpu().double() - ref_lse).abs().max()) < 1e-3


def test_scale_error_is_detected():
    from harness.kernels.fused_mla_decode import Config

    q_nope, q_pe, pool, indptr, indices = problem([300, 17], 8, rows=2000, seed=9)
    ref_out, _ = reference(q_nope.cpu(), q_pe.cpu(), pool.cpu(), indptr.cpu(), indices.cpu())
    for config in (Config(4, 32), *cuda_configs(1, 12)):
        good, _ = run_kernel(q_nope, q_pe, pool, indptr, indices, config)
        bad, _ = run_kernel(q_nope, q_pe, pool, indptr, indices, config, kv_scale=1.01)
        assert norm_rel(good.cpu(), ref_out) < 3e-3 < norm_rel(bad.cpu(), ref_out), config


def test_cuda_kernel_merges_in_one_launch_and_rearms():
    """The split CUDA kernel's in-kernel merges (the last CTA per request; with grid_merge all of them, a
    channel slice each, once every split has arrived) merge the splits and re-arm the arrival counters:
    they are zero after a launch, and a second launch on the same buffers agrees bit for bit; the grid
    merge also eagerly and from a replayed graph with the partials poisoned (NaN) before every run, so a
    split that merged before the others had written would show. Planted faults: a counter one short
    makes no CTA merge and stays non-zero; for the grid merge a counter past every split's arrival makes
    no split wait and none re-arm it. (The grid-merge launches here are one wave: 32 and 128 CTAs of two
    per SM, 64 ping-pong CTAs of one; launches past one wave merge the last-CTA way, as the hidden-shape tests'
    larger cases do.)"""
    from harness.kernels.fused_mla_decode import fused_mla_decode, partial_buffers

    q_nope, q_pe, pool, indptr, indices = problem([700, 3, 1500, 64], 20, rows=4000, seed=11)
    ref_out, _ = reference(q_nope.cpu(), q_pe.cpu(), pool.cpu(), indptr.cpu(), indices.cpu())
    for config in cuda_configs(1, 2, 9, 10, 13, 15):
        parts = partial_buffers(4, 20, config, 512, "cuda")
        runs = [fused_mla_decode(q_nope, q_pe, pool[..., :512], pool[..., 512:], indptr, indices, SM_SCALE, config,
                                 partials=parts) for _ in range(2)]
        assert int(parts[2].abs().sum()) == 0, config
        assert torch.equal(runs[0][0].view(torch.int16), runs[1][0].view(torch.int16)), config
        assert norm_rel(runs[0][0].cpu(), ref_out) < 3e-3, config
        n = config.num_splits
        if config.grid_merge:
            eager, captured = eager_and_replayed(q_nope, q_pe, pool, indptr, indices, config, parts)
            assert norm_rel(eager[0].cpu(), ref_out) < 3e-3, config
            assert torch.equal(eager[0].view(torch.int16), runs[0][0].view(torch.int16)), config
            assert torch.equal(eager[0].view(torch.int16), captured[0].view(torch.int16)), config
            assert torch.equal(eager[1], captured[1]), config
            parts[2].fill_(2 * n)  # negative control: every split counts as arrived: none waits, none re-arms
            fused_mla_decode(q_nope, q_pe, pool[..., :512], pool[..., 512:], indptr, indices, SM_SCALE, config, partials=parts)
            assert parts[2].tolist()[:4] == [4 * n] * 4, config
        else:
            parts[2].fill_(-1)  # negative control: one arrival short, no CTA merges and the counter is not re-armed
            fused_mla_decode(q_nope, q_pe, pool[..., :512], pool[..., 512:], indptr, indices, SM_SCALE, config, partials=parts)
            assert parts[2].tolist()[:4] == [n - 1] * 4, config


def eager_and_replayed(q_nope, q_pe, pool, indptr, indices, config, parts):
    """(eager outputs, outputs of a captured graph replayed three times), the partial buffers
    poisoned (NaN) before each run: a merge that reads anything the splits did not write shows."""
    from harness.kernels.fused_mla_decode import fused_mla_decode

    def run():
        for t in parts[:2]:
            t.fill_(float("nan"))
        return fused_mla_decode(q_nope, q_pe, pool[..., :512], pool[..., 512:], indptr, indices, SM_SCALE, config,
                                partials=parts)
    eager = run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    return eager, captured


def test_cuda_split_merge_waits_for_the_splits_in_a_graph():
    """The split CUDA path with pdl_merge (decode kernel, then the merge as a programmatic dependent
    launch on sm_90+) gives the reference's output eagerly and from a replayed CUDA graph, bit for bit, with
    the partial buffers poisoned (NaN) before every run: the merge reads only what the splits wrote.
    Planted fault: the merge alone on the poisoned buffers must give NaN, so this check can fail."""
    from harness.kernels import fused_mla_cuda
    from harness.kernels.fused_mla_decode import partial_buffers

    q_nope, q_pe, pool, indptr, indices = problem([700, 3, 1500, 64], 20, rows=4000, seed=11)
    ref_out, _ = reference(q_nope.cpu(), q_pe.cpu(), pool.cpu(), indptr.cpu(), indices.cpu())
    for config in [dataclasses.replace(c, pdl_merge=True) for c in cuda_configs(1, 2)]:
        parts = partial_buffers(4, 20, config, 512, "cuda")
        eager, captured = eager_and_replayed(q_nope, q_pe, pool, indptr, indices, config, parts)
        assert norm_rel(eager[0].cpu(), ref_out) < 3e-3, config
        assert torch.equal(eager[0].view(torch.int16), captured[0].view(torch.int16)), config
        assert torch.equal(eager[1], captured[1]), config
        for t in parts[:2]:
            t.fill_(float("nan"))
        fused_mla_cuda.merge(parts[0], parts[1], captured[0], captured[1], 1.0)  # negative control: no splits ran
        torch.cuda.synchronize()
        assert torch.isnan(captured[0].float()).all(), config


@pytest.mark.parametrize("heads", [8, 20])
def test_cuda_cluster_merge_past_one_wave(heads):
    """A cluster merge with more clusters than the GPU holds at once: the requests of one wave of
    clusters merge in distributed shared memory, the rest run beside them (a programmatic dependent
    launch waiting for the clusters at its end) merged by their last CTA. Outputs match the float64
    reference eagerly and bit for bit from a replayed graph, with the partials poisoned (NaN) before
    every run. Planted fault: arrival counters one short make no CTA of the rest merge, and only the
    rest's counters, at rest_splits - 1, show it (the clusters never count)."""
    from harness.kernels import fused_mla_cuda as fc
    from harness.kernels.fused_mla_decode import fused_mla_decode, partial_buffers

    config = cuda_configs(7)[0]  # 8 splits, 2 stages, 8 warps, cluster merge
    nh = fc.heads_per_cta(heads)
    groups = -(-heads // nh)
    max_clusters, slots = fc._wave(config.cuda_instance(heads), config.num_splits, torch.cuda.current_device())
    splits = [(batch, *fc.wave_split(batch, groups, config.num_splits, max_clusters, slots))
              for batch in range(max_clusters // groups + 3, max_clusters // groups, -1)]
    batch, head, rest_splits = next((s for s in splits if s[1] < s[0]), splits[-1])
    assert head < batch and rest_splits >= config.num_splits, (max_clusters, slots, splits)
    lens = [[300, 1, 97, 64, 2, 1031][i % 6] for i in range(batch)]
    q_nope, q_pe, pool, indptr, indices = problem(lens, heads, rows=9000, seed=13)
    ref_out, ref_lse = reference(q_nope.cpu(), q_pe.cpu(), pool.cpu(), indptr.cpu(), indices.cpu())
    parts = partial_buffers(batch, heads, config, 512, "cuda")
    eager, captured = eager_and_replayed(q_nope, q_pe, pool, indptr, indices, config, parts)
    assert norm_rel(eager[0].cpu(), ref_out) < 3e-3
    assert float((eager[1].cpu().double() - ref_lse).abs().max()) < 1e-3
    assert torch.equal(eager[0].view(torch.int16), captured[0].view(torch.int16)) and torch.equal(eager[1], captured[1])
    assert int(parts[2].abs().sum()) == 0  # the rest's last CTAs re-armed their counters
    parts[2].fill_(-1)  # negative control: one arrival short
    fused_mla_decode(q_nope, q_pe, pool[..., :512], pool[..., 512:], indptr, indices, SM_SCALE, config, partials=parts)
    torch.cuda.synchronize()
    per_request = parts[2][:(batch - head) * groups].tolist()
    assert per_request == [rest_splits - 1] * len(per_request) and set(parts[2][len(per_request):].tolist()) == {-1}


def test_cuda_graph_replan_follows_the_step(gpu_device):
    """A graph captured over a plan and re-planned in place for another step gives that step's outputs."""
    from harness.backends import make_backend
    from harness.strategies import REGISTRY

    case = load_case("glm5-tp8.ci.ragged-mix")  # two steps of the same batch, every length grows
    schedule = case.schedule()
    pool = KVPool(case.geometry, case.scenario.seed, gpu_device)
    data = make_step_data(case.preset, schedule, pool)
    strategy = REGISTRY["fused_fp8"](pool, make_backend("torch", gpu_device), case.preset)
    first, last = schedule.steps
    with DecodeSession(strategy, schedule, data):
        q, kv = data.queries[(last.step, 0)], strategy.prepare_kv(0)
        eager_out, eager_lse = strategy.attend(strategy.begin_step(last), *q, kv)
        plan = strategy.begin_step(last, graph_capacity=len(last.kv_indices))
        strategy.replan_step(plan, first)
        strategy.attend(plan, *q, kv)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, lse = strategy.attend(plan, *q, kv)
        graph.replay()
        assert not torch.equal(lse, eager_lse)  # negative control: the first step's rows differ
        strategy.replan_step(plan, last)
        graph.replay()
        assert torch.equal(out.view(torch.int16), eager_out.view(torch.int16)) and torch.equal(lse, eager_lse)


# A kernel that lets the stream's next (programmatic dependent) launch start at once and writes `n` 576-byte rows
# `delay_ns` later: a decode step's KV write (or a Q written by the kernel before the attention) seen by an
# attention that loads its first tiles before it waits (launched eagerly, the attention's host time alone let the
# writer finish first: the race never ran).
LATE_WRITE = r"""
extern "C" __global__ void late_write(unsigned char* pool, const int* rows, const unsigned char* src, int n, int delay_ns) {
  asm volatile("griddepcontrol.launch_dependents;");
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < (unsigned long long)delay_ns);
  for (int e = threadIdx.x; e < n * 576; e += blockDim.x) pool[(long long)rows[e / 576] * 576 + e % 576] = src[e];
}
"""


def late_writer():
    """LATE_WRITE compiled for this GPU (a skip where programmatic dependent launches are missing: before sm_90)."""
    from torch.cuda._utils import _cuda_load_module

    from harness.kernels import fused_mla_cuda as fc
    from harness.kernels import nvrtc

    if not fc.dependent_launches(torch.cuda.current_device()):
        pytest.skip("programmatic dependent launches need sm_90 or newer")
    major, minor = torch.cuda.get_device_capability()
    return _cuda_load_module(nvrtc.build(LATE_WRITE, [], f"{major}{minor}").cubin, ["late_write"])["late_write"]

def test_cuda_early_tiles_leave_the_new_token_rows_to_after_the_wait():
    """With indices_ready and new_tokens=1 the kernel issues its first tiles' loads before it waits for the
    stream's previous kernel, but not a tile holding a request's last row: behind a kernel that lets it start
    at once and writes every request's last row 1 ms later (both in one CUDA graph), the outputs are the
    float64 reference's with the written rows, for direct, split (last-CTA, cluster) and ping-pong launches,
    whose prologues hold those rows (requests of 64, 128 and 192 tokens; gathered rows and page runs) or do
    not (1000). Planted fault: new_tokens=0 loads them before they are written, and the outputs miss them."""
    from harness.kernels.fused_mla_decode import fused_mla_decode, partial_buffers

    writer = late_writer()
    lens = [128, 64, 1000, 128, 192]
    q_nope, q_pe, pool, indptr, indices = problem(lens, 8, rows=3000, seed=17)
    indices[128:192] = torch.arange(2000, 2064)  # the 64 and 192 token requests are page runs (one bulk copy a tile)
    indices[1320:] = torch.arange(2100, 2292)
    last = indices[indptr[1:].long() - 1].contiguous()
    old = pool[last.long()].clone()
    new = (old.reshape(len(lens), 576) + 0x18).contiguous()  # each exponent + 3: values x8, still finite
    written = pool.clone()
    written[last.long()] = new.reshape(old.shape)
    ref_out, _ = reference(q_nope.cpu(), q_pe.cpu(), written.cpu(), indptr.cpu(), indices.cpu())

    def behind_late_write(config, parts, new_tokens):
        """The writer and the attention captured in one graph (as a step's are: no host time between the launches)."""
        call = lambda: fused_mla_decode(q_nope, q_pe, pool[..., :512], pool[..., 512:], indptr, indices, SM_SCALE,  # noqa: E731
                                        config, partials=parts, indices_ready=True, new_tokens=new_tokens)
        call()  # compiled outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            writer(grid=(1, 1, 1), block=(256, 1, 1), args=[pool, last, new, len(lens), 1_000_000])
            out, _ = call()
        pool[last.long()] = old
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(pool, written), config
        return out.cpu()

    for config in cuda_configs(0, 1, 7, 12, 14):
        parts = partial_buffers(len(lens), 8, config, 512, "cuda")
        out = behind_late_write(config, parts, 1)
        errors = [norm_rel(out[b:b + 1], ref_out[b:b + 1]) for b in range(len(lens))]
        assert max(errors) < 3e-3, (config, errors)
        bad = behind_late_write(config, parts, 0)  # negative control: nothing left to after the wait
        bad_errors = [norm_rel(bad[b:b + 1], ref_out[b:b + 1]) for b in range(len(lens))]
        assert max(bad_errors) > 0.05 and bad_errors[2] < 3e-3, (config, bad_errors)


def test_cuda_q_is_read_after_the_wait(tmp_path, monkeypatch):
    """The kernel prefetches Q's lines into L2 and fetches its index tiles before it waits for the stream's previous
    kernel, but loads Q after the wait: behind a kernel that lets it start at once and writes a new Q 1 ms later
    (both in one CUDA graph), the outputs are the float64 reference's with the new Q, for direct, split (last-CTA,
    cluster) and ping-pong launches. Planted fault: the kernel built with DIAG_EARLY_Q=1 (Q loaded before the wait)
    reads the old Q and fails."""
    import functools

    from harness.kernels import fused_mla_cuda as fc
    from harness.kernels.fused_mla_decode import fused_mla_decode, partial_buffers

    writer = late_writer()
    lens = [128, 64, 1000, 128, 192]
    q_nope, q_pe, pool, indptr, indices = problem(lens, 8, rows=3000, seed=19)
    old = torch.cat([q_nope, q_pe], -1).contiguous()
    new = (old.float() * -1.5).to(old.dtype)  # every logit changes
    q = old.clone()  # Q as one buffer of [B, H, 576], written by late_write as 576-byte rows
    q_rows = torch.arange(q.numel() * q.element_size() // 576, dtype=torch.int32, device=q.device)
    ref_out, _ = reference(new[..., :512].cpu(), new[..., 512:].cpu(), pool.cpu(), indptr.cpu(), indices.cpu())

    def behind_late_q(config, parts):
        call = lambda: fused_mla_decode(q[..., :512], q[..., 512:], pool[..., :512], pool[..., 512:], indptr, indices,  # noqa: E731
                                        SM_SCALE, config, partials=parts, indices_ready=True, new_tokens=1)
        call()  # compiled outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            writer(grid=(1, 1, 1), block=(256, 1, 1), args=[q, q_rows, new, len(q_rows), 1_000_000])
            out, _ = call()
        q.copy_(old)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(q, new), config
        return out.cpu()

    configs = cuda_configs(0, 1, 7, 12, 14)
    for config in configs:
        out = behind_late_q(config, partial_buffers(len(lens), 8, config, 512, "cuda"))
        errors = [norm_rel(out[b:b + 1], ref_out[b:b + 1]) for b in range(len(lens))]
        assert max(errors) < 3e-3, (config, errors)
    planted = tmp_path / "early_q.cu"  # negative control: the kernel loading Q before the wait
    planted.write_text("#define DIAG_EARLY_Q 1\n" + fc.SOURCE.read_text())
    monkeypatch.setattr(fc, "SOURCE", planted)
    for name in fc.SOURCE_CACHES:
        monkeypatch.setattr(fc, name, functools.cache(getattr(fc, name).__wrapped__))
    bad = behind_late_q(configs[0], partial_buffers(len(lens), 8, configs[0], 512, "cuda"))
    assert min(norm_rel(bad[b:b + 1], ref_out[b:b + 1]) for b in range(len(lens))) > 0.05
