"""Autotune the fused FP8 MLA decode on this GPU and write harness/kernels/fused_tuning.toml.

For each (batch, kv_len) shape: a production-size FP8 pool (the preset at prod scale: glm5-tp8 495,552
slots, 78 layers, 8 heads, 64-slot pages; deepseek-v3-tp8 61 layers, 16 heads, page size 1), token-level
indices laid out as the preset's pages (random pages, consecutive tokens inside one; page size 1: random
rows), and every Config of the search space (splits x TILES). Each candidate is timed as a CUDA graph of
every layer's attention (each layer its own pool and queries, so nothing stays in L2 across layers, as in a
decode step); the figure is the median replay time / layers. The fastest Config per shape bucket goes to
the table as an entry for the preset's head count, with its time and byte-floor ratio in the comments;
the table's other entries are kept as they are. The full search takes about one to two minutes per shape
on an H200 (compiles included).
  python -m ci.experiments.tune_fused [--preset glm5-tp8] [--out PATH] [--json PATH] [--shapes 1x512,32x4096,...]
                          [--compare-p-split] [--search tiles|split|tokens_m|cuda] [--layers N]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
import time
import tomllib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from harness.kernels.fused_mla_cuda import CLUSTER_SPLITS  # noqa: E402
from harness.kernels.fused_mla_decode import P_SPLIT, Config, fused_mla_decode, partial_buffers  # noqa: E402
from harness.kernels.fused_tuning import TABLE_FILE, bucket, default_config, entry_for, entry_key, load_table  # noqa: E402
from harness.measure.control import measure_control  # noqa: E402
from harness.measure.timing import event_time_ms  # noqa: E402
from harness.spec.gpus import gpu_key  # noqa: E402
from harness.spec.presets import get_preset, get_scale  # noqa: E402
from harness.spec.schedule import NEW_TOKENS  # noqa: E402

SHAPES = "1x512,1x4096,32x4096,128x2048,8x2048,64x1024"
# (block_n, num_warps, num_stages, reload_v, prefetch, pv_fp16): the tile variants searched. Only
# reload_v's K^T load is pipelined by Triton's cp.async stages (checked in the sm_90 PTX), so only
# it is searched over num_stages.
TILES = tuple((bn, w, 2, False, prefetch, pv) for bn, w in ((32, 4), (64, 8)) for prefetch in (False, True)
              for pv in (False, True) if not (prefetch and not pv)) + tuple(
    (bn, w, stages, True, False, True) for bn in (32, 64) for w in (4, 8) for stages in (2, 3, 4))
# --search split: the 2-3-tile-deep pipelines. Triton gives a load that depends on another load
# (the tile on its indices) (num_stages - 1) // 2 extra buffers, so num_stages 5 double-buffers the
# tile and 7 triple-buffers it (compile-time stats: git show 2e17985:docs/h200/fused/README.md). Fields:
# (block_n, num_warps, num_stages, reload_v, pv_fp16, dv_split, qk_chunk, contig); the first is
# the committed b32 / b128 entry, the reference to beat.
SPLIT_TILES = ((32, 4, 4, True, True, 1, 0, False),
               (32, 4, 5, True, True, 1, 0, False), (32, 4, 5, False, True, 1, 0, True),
               (32, 4, 5, False, True, 2, 0, False), (32, 4, 7, False, True, 2, 0, False),
               (32, 4, 5, False, True, 2, 0, True), (32, 4, 5, False, True, 2, 128, False),
               (32, 4, 5, False, True, 4, 0, False), (32, 4, 5, False, True, 4, 0, True),
               (32, 4, 5, False, False, 2, 0, False))
SPLIT_SPLITS = (1, 2, 4, 8, 16)
# --search tokens_m: the tokens-as-M kernel (Config.tokens_m: wgmma on sm_90, K and V^T cp.async
# pipelined; compile-time stats in git show 2e17985:docs/h200/fused/README.md) beside run4's b32 / b128 reload_v
# tiles (bn32, 4 / 3 stages, fp16 P.V); the committed entry comes first anyway (search_space). Fields:
# (block_n, num_warps, num_stages, pv_fp16, tokens_m); splits from TOKM_SPLITS, at most one wave
# of 2 programs per SM, no split under 2 tiles.
TOKM_TILES = ((32, 4, 4, True, False), (32, 4, 3, True, False),
              (64, 4, 3, True, True), (64, 4, 5, True, True), (64, 8, 3, True, True),
              (128, 8, 3, True, True), (64, 4, 3, False, True))
TOKM_SPLITS = (1, 2, 4, 8)
# --search cuda: the CUDA kernel (Config.cuda: 64-token tiles) over (ring depth, warps, ping_pong) and the
# splits that keep every CTA in one wave: one CTA per SM, two for the 2-stage 8-warp ring; a split
# launch with each merge (the last CTA of each request, Config.pdl_merge, Config.cluster_merge, Config.grid_merge).
CUDA_TILES = ((2, 8, False), (3, 8, False), (4, 8, False), (3, 16, False), (4, 16, False), (2, 16, True))  # stages, warps, ping_pong
CUDA_SPLITS = (1, 2, 4, 8, 16, 32, 64)
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128)
REPLAYS = 15


def split_candidates(batch: int, kv_len: int, sm_count: int):
    """--search split: SPLIT_TILES over SPLIT_SPLITS, at most two waves of 2 programs per SM
    counting each column part as a program, no split under 2 tiles."""
    for splits, (block_n, warps, stages, reload_v, pv_fp16, dv, chunk, contig) in itertools.product(SPLIT_SPLITS, SPLIT_TILES):
        if kv_len // splits < 2 * block_n or batch * splits * dv > 4 * sm_count or (splits == 1 and batch * dv < 64):
            continue
        yield Config(splits, block_n, warps, stages, reload_v, pv_fp16, False, dv, chunk, contig)


def tokens_m_candidates(batch: int, kv_len: int, sm_count: int):
    """--search tokens_m: TOKM_TILES over TOKM_SPLITS (the first two tiles are run4's reload_v ones)."""
    for splits, (block_n, warps, stages, pv_fp16, tokens_m) in itertools.product(TOKM_SPLITS, TOKM_TILES):
        if kv_len // splits < 2 * block_n or batch * splits > 2 * sm_count or (splits == 1 and batch < 64):
            continue
        yield Config(splits, block_n, warps, stages, reload_v=not tokens_m, pv_fp16=pv_fp16, tokens_m=tokens_m)


def cuda_candidates(batch: int, kv_len: int, sm_count: int):
    """--search cuda: CUDA_TILES over CUDA_SPLITS, one wave, no split without a tile."""
    for splits, (stages, warps, ping_pong) in itertools.product(CUDA_SPLITS, CUDA_TILES):
        per_sm = 2 if (stages, warps, ping_pong) == (2, 8, False) else 1
        if splits > 1 and (batch * splits > per_sm * sm_count or kv_len < 64 * splits):
            continue
        merges = [{}]
        if splits > 1:
            merges += [dict(pdl_merge=True), dict(grid_merge=True)] + ([dict(cluster_merge=True)] if splits in CLUSTER_SPLITS else [])
        for merge in merges:
            yield Config(splits, 64, warps, stages, pv_fp16=True, cuda=True, ping_pong=ping_pong, **merge)


def search_space(search: str, batch: int, kv_len: int, heads: int, sm_count: int, gpu: str | None = None) -> list[Config]:
    """The Configs a search times for one shape: the committed table's entry for its bucket and heads on `gpu` first
    (the one fused_fp8 runs there: the reference to beat, whatever the search), then the search's own candidates."""
    space = list(dict(split=split_candidates, tokens_m=tokens_m_candidates, cuda=cuda_candidates).get(search, candidates)(batch, kv_len, sm_count))
    committed = entry_for(load_table(), batch, kv_len, heads, gpu)
    return space if committed is None else [committed] + [c for c in space if c != committed]


def candidates(batch: int, kv_len: int, sm_count: int):
    for splits, (block_n, warps, stages, reload_v, prefetch, pv_fp16) in itertools.product(SPLITS, TILES):
        if kv_len // splits < block_n or batch * splits > 2 * sm_count or (splits == 1 and batch < 32):
            continue
        yield Config(splits, block_n, warps, stages, reload_v, pv_fp16, prefetch)


def page_indices(batch: int, kv_len: int, page: int, slots: int, generator, device) -> torch.Tensor:
    """Token-level indices as the paged allocator lays them out: each request on whole random
    pages of `page` slots (page 0 never handed out), its tokens consecutive inside a page."""
    per_req = -(-kv_len // page)
    pages = torch.randperm(slots // page, generator=generator, device=device)[:batch * per_req] + 1
    rows = (pages[:, None] * page + torch.arange(page, device=device)).reshape(batch, -1)[:, :kv_len]
    return rows.reshape(-1).to(torch.int32)


def capture(fn) -> torch.cuda.CUDAGraph:
    """A CUDA graph that calls fn() once (fn run eagerly first: it compiles and allocates), replayed once."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def replay_ms(graph: torch.cuda.CUDAGraph, replays: int = REPLAYS) -> float:
    """Median ms of one replay of `graph`."""
    return statistics.median(event_time_ms(graph.replay, replays, warmup=0))


def time_graph(fn, replays: int = REPLAYS) -> float:
    """Median ms of one replay of a graph that calls fn() once."""
    return replay_ms(capture(fn), replays)


def tune_shape(pools, batch, kv_len, preset, sm_count, gbps, log, compare_p_split=False, search="tiles", gpu=None):
    dev = pools[0].device
    heads = preset.heads_per_rank
    g = torch.Generator(device=dev).manual_seed(batch * 7919 + kv_len)
    indices = page_indices(batch, kv_len, preset.page_size, pools[0].shape[0] - preset.page_size, g, dev)
    indptr = torch.arange(0, batch * kv_len + 1, kv_len, dtype=torch.int32, device=dev)
    qs = [(torch.randn(batch, heads, 512, device=dev).to(torch.bfloat16),
           torch.randn(batch, heads, 64, device=dev).to(torch.bfloat16)) for _ in pools]
    kv_bytes = batch * kv_len * 576
    floor_us = kv_bytes / (gbps * 1e9) * 1e6
    results, other = [], []  # other: the P.V dot with the other P_SPLIT setting, for the record
    p_splits = (P_SPLIT, not P_SPLIT) if compare_p_split else (P_SPLIT,)
    for config, p_split in itertools.product(search_space(search, batch, kv_len, heads, sm_count, gpu), p_splits):
        parts = partial_buffers(batch, heads, config, 512, dev)

        def step():
            for pool, (qn, qp) in zip(pools, qs):
                fused_mla_decode(qn, qp, pool[..., :512], pool[..., 512:], indptr, indices, preset.sm_scale, config,
                                 partials=parts, p_split=p_split, indices_ready=True, new_tokens=NEW_TOKENS)  # as fused_fp8 calls it
        try:
            us = time_graph(step) * 1e3 / len(pools)
        except Exception as exc:  # a config that does not compile or fit is skipped, not fatal
            log(f"  {config}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        (results if p_split == P_SPLIT else other).append((us, config))
    results.sort(key=lambda r: r[0])
    other.sort(key=lambda r: r[0])
    if other:
        log(f"  P_SPLIT={not P_SPLIT}: best {other[0][1]} {other[0][0]:.1f} us/layer")
    default = default_config(batch, kv_len, heads, sm_count)
    default_us = next((us for us, c in results if c == default), None)
    best_us, best = results[0]
    log(f"b{batch}-l{kv_len}: best {best} {best_us:.1f} us/layer, floor {floor_us:.1f} us "
        f"(x{best_us / floor_us:.2f}); default {default} {default_us}")
    return dict(batch=batch, kv_len=kv_len, heads=heads, best_us=best_us, floor_us=floor_us, config=best.__dict__,
                default=default.__dict__, default_us=default_us,
                other_p_split=dict(p_split=not P_SPLIT, us=other[0][0], **other[0][1].__dict__) if other else None,
                top=[dict(us=us, **c.__dict__) for us, c in results[:8]])


HEADER = ["# Fused FP8 MLA decode launch table, written by `python -m ci.experiments.tune_fused` on a GPU.",
          "# Keys: batch and kv_len buckets (nearest powers of two), and heads (query heads per rank) where an entry",
          "# is for one head count only; values: the fastest measured Config. Shapes with no entry use",
          "# harness.kernels.fused_tuning.default_config. Each entry's comment: where and how it was measured."]


def split_table(text: str) -> tuple[str, list[str]]:
    """A table file's preamble (the text before its first entry) and its [[entry]] blocks, each as written."""
    preamble, *parts = text.split("[[entry]]")
    return preamble.rstrip("\n"), ["[[entry]]" + part.rstrip("\n") for part in parts]


def write_table(path: Path, entries: list[dict], env: str, preset: str, gpu: str | None = None) -> None:
    """The table at `path` with an entry per tuned shape for its heads (and for `gpu` alone, when given); the file's
    preamble and other entries are kept as written (a new file gets HEADER)."""
    blocks = {}
    for e in entries:
        c = e["config"]
        key = (bucket(e["batch"]), bucket(e["kv_len"]), e["heads"], *((gpu_key(gpu),) if gpu else ()))
        blocks[key] = "\n".join([
            "[[entry]]", f"batch = {key[0]}", f"kv_len = {key[1]}", f"heads = {key[2]}", *([f"gpu = {json.dumps(gpu)}"] if gpu else []),
            *(f"{f.name} = {str(c[f.name]).lower()}" for f in dataclasses.fields(Config)),
            f"# {preset} on {env}: {e['best_us']:.1f} us/layer; FP8 byte floor {e['floor_us']:.1f} us "
            f"(x{e['best_us'] / e['floor_us']:.2f})"])
    preamble, old = split_table(path.read_text() if path.exists() else "\n".join(HEADER))
    kept = [b for b in old if entry_key(tomllib.loads(b)["entry"][0]) not in blocks]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n\n".join([preamble, *kept, *blocks.values()]) + "\n")
    tmp.replace(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="glm5-tp8")
    ap.add_argument("--out", type=Path, default=TABLE_FILE)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--layers", type=int, help="default: the preset's")
    ap.add_argument("--search", choices=("tiles", "split", "tokens_m", "cuda"), default="tiles",
                    help="tiles: TILES x SPLITS (the run2-run4 space); split: SPLIT_TILES x SPLIT_SPLITS "
                         "(deep pipelines, V column parts, QK chunks, contiguous runs); tokens_m: TOKM_TILES x "
                         "TOKM_SPLITS (the wgmma tokens-as-M kernel beside the committed reload_v entry); cuda: the CUDA "
                         "kernel over CUDA_TILES x CUDA_SPLITS")
    ap.add_argument("--compare-p-split", action="store_true", help="also time the P.V dot with the other P_SPLIT")
    ap.add_argument("--gpu-entries", action="store_true",
                    help="write entries for this GPU alone (gpu = its name): the others keep theirs")
    args = ap.parse_args()
    dev = torch.device("cuda")
    preset = get_preset(args.preset)
    slots, page = get_scale("prod").slots, preset.page_size
    props = torch.cuda.get_device_properties(dev)
    gbps = measure_control(dev).median
    env = f"{props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs), copy {gbps:.0f} GB/s"
    print(env, flush=True)
    pools = []
    for layer in range(args.layers or preset.num_layers):
        pool = torch.randint(0, 0x7E, (slots + page, 1, 576), dtype=torch.uint8, device=dev)  # finite e4m3 codes
        pools.append(pool)
    entries = []
    for shape in args.shapes.split(","):
        batch, kv_len = (int(x) for x in shape.split("x"))
        t0 = time.time()
        entries.append(tune_shape(pools, batch, kv_len, preset, props.multi_processor_count, gbps,
                                  lambda m: print(m, flush=True), args.compare_p_split, args.search, props.name))
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
        write_table(args.out, entries, env, preset.name, props.name if args.gpu_entries else None)  # after every shape: a cut-short run keeps what it measured
        if args.json:
            args.json.write_text(json.dumps(dict(environment=env, copy_gbps=gbps, shapes=entries), indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
