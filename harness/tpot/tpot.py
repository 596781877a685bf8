"""`harness tpot`: time the model-shaped decode step per strategy; roofline and attention share beside it.

tpot_ms: one decode step of one TP rank (on CUDA one CUDA-graph replay of the whole step, host
re-plan included, CUDA events); attn_path_ms: the strategy's attention path alone (the harness's
step_ms: writes, casts, attention over every layer, synthetic queries); attn_share = their ratio (CUDA; on CPU
null: host times of separate runs are no share of the step).
roofline_ms: the step's bytes (weights + KV + casts) over the measured device copy bandwidth, plus the
all-reduce model's latency (two per layer at the step's message size; 0 when none is modeled).
breakdown (CUDA, in the tpot_ms row's detail): where the time goes: each component of the step
(step.PARTS: gemm, moe, attention, allreduce, other) captured as its own CUDA graph over every layer,
replayed and timed like the step, beside its own floor (its bytes at the copy bandwidth; the
all-reduce model's latency). The strategy-independent components are timed once per run.
Every timing block runs under the clock guard (harness.measure.collect.guarded), as `run`'s do: its guard is
detail["guard"] of the row it timed (tpot_ms, attn_path_ms), each component's in its breakdown entry and the
rotation check's as rotated_guard / distinct_guard.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from harness.backends import make_backend
from harness.errors import CheckFailed, HarnessError
from harness.execute.decode import DecodeSession, make_step_data
from harness.execute.prepared import case_memory_plan
from harness.inputs.cases import Case
from harness.inputs.memory import GIB
from harness.inputs.pool import KVPool, PoolGeometry
from harness.measure import collect
from harness.measure.timing import event_time_ms, host_time_ms
from harness.results.document import Row
from harness.results.schema import sample_iqr
from harness.strategies import REGISTRY
from harness.tpot import bytes as nbytes
from harness.tpot.allreduce import AllReduce
from harness.tpot.config import ModelShape
from harness.tpot.step import PARTS, ModelStep
from harness.tpot.weights import make_weights


@dataclass
class TpotResult:
    strategy: str
    tpot_ms: list[float]
    attn_path_ms: list[float]
    step_bytes: nbytes.StepBytes
    active_experts: int  # distinct routed experts read, summed over MoE layers
    kernels: dict[str, str]
    unsupported: str | None = None
    extra: dict = field(default_factory=dict)
    guards: dict[str, dict] = field(default_factory=dict)  # metric -> clock guard of its timing block

    @property
    def tpot(self) -> float:
        return statistics.median(self.tpot_ms)

    @property
    def attn_share(self) -> float:
        return statistics.median(self.attn_path_ms) / self.tpot


def hidden_states(shape: ModelShape, batch_size: int, seed: int, device) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn((batch_size, shape.hidden_size), generator=gen).to(device=device, dtype=torch.bfloat16)


def kernel_breakdown(run, top: int = 12) -> dict:
    """Device time of the kernels one eager call of `run` launches, by kernel name (torch.profiler):
    where the step's time goes, and how much of it is launch gaps rather than kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    kernels = []
    for evt in prof.key_averages():
        if getattr(evt, "device_type", None) != DeviceType.CUDA:
            continue
        us = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
        kernels.append((float(us), int(evt.count), evt.key))
    kernels.sort(reverse=True)
    return {"kernel_ms": sum(k[0] for k in kernels) / 1e3, "launches": sum(k[1] for k in kernels),
            "top": [{"name": name[:90], "ms": us / 1e3, "count": n} for us, n, name in kernels[:top]]}


SHARED_PARTS = tuple(p for p in PARTS if p != "attention")  # the same for every strategy


def time_parts(model: ModelStep, strategy, hidden, plan, last, slots, parts, repeats: int) -> dict[str, tuple[list[float], dict]]:
    """(device time samples, clock guard) of each component in `parts`, each its own CUDA graph (see step.PARTS)."""
    out = {}
    for part in parts:
        _, graph, _ = model.capture(hidden, last, slots, parts=(part,), plan=plan)
        if part == "attention":  # the host re-plan belongs to the attention path, as in the step
            def run(graph=graph):
                strategy.replan_step(plan, last)
                graph.replay()
        else:
            run = graph.replay
        out[part] = collect.guarded(lambda run=run: event_time_ms(run, repeats), strategy.device)
        del graph, run
    return out


def _parts_extra(name: str, parts: dict, ctx: "TpotContext") -> dict:
    timed = {**ctx.shared_parts, **parts}  # component -> (samples, guard)
    return {"parts_ms": {p: statistics.median(timed[p][0]) for p in PARTS}, "parts_guard": {p: timed[p][1] for p in PARTS},
            "parts_timed_with": {p: (name if p in parts else "an earlier strategy of this run") for p in PARTS}}


def time_strategy(name: str, ctx: "TpotContext", repeats: int, profile: bool = False, breakdown: bool = False) -> TpotResult:
    """Set the strategy up on the shared pool, time the model step and its attention path alone (each under the clock guard)."""
    cls = REGISTRY[name]
    strategy = cls(ctx.pool, ctx.backend, ctx.case.preset)
    last = ctx.schedule.steps[-1]
    slots = ctx.data.steps[last.step].slots
    hidden = hidden_states(ctx.shape, last.batch_size, ctx.case.scenario.seed, ctx.device)
    guards = {}

    def timed(metric: str, block) -> list[float]:
        samples, guards[metric] = collect.guarded(block, ctx.device)
        return samples

    with DecodeSession(strategy, ctx.schedule, ctx.data) as session:
        model = ModelStep(ctx.shape, ctx.weights, strategy, ctx.allreduce, last.batch_size)
        if ctx.device.type == "cuda":
            plan, graph, _ = model.capture(hidden, last, slots)

            def replay():
                strategy.replan_step(plan, last)
                graph.replay()

            tpot = timed("tpot_ms", lambda: event_time_ms(replay, repeats))
            del graph
            extra = {}
            if breakdown:
                step_ids = dict(model.last_expert_ids)  # the component warm-ups route other inputs
                wanted = ("attention",) + tuple(p for p in SHARED_PARTS if p not in ctx.shared_parts)
                parts = time_parts(model, strategy, hidden, plan, last, slots, wanted, repeats)
                model.last_expert_ids = step_ids
                ctx.shared_parts.update({p: v for p, v in parts.items() if p != "attention"})
                extra.update(_parts_extra(name, parts, ctx))
            bucket = session.bucket_graph(last)  # the attention path alone, replayed as `run` replays it

            def attn_replay():
                bucket.load(last)
                bucket.replay()

            attn = timed("attn_path_ms", lambda: event_time_ms(attn_replay, repeats))
            if profile:
                try:
                    extra["eager_kernels"] = kernel_breakdown(lambda: model.forward(hidden, plan, last, slots))
                except Exception as exc:  # profiling is a diagnosis: its failure is noted, not fatal
                    extra["eager_kernels"] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
        else:
            extra = {}
            plan = strategy.begin_step(last)
            tpot = timed("tpot_ms", lambda: host_time_ms(lambda: model.forward(hidden, plan, last, slots), repeats))
            if breakdown:  # host wall time per component: a CPU check of the mechanics, not a measurement
                step_ids = dict(model.last_expert_ids)
                parts = {}
                for part in PARTS:
                    model.parts = frozenset((part,))
                    parts[part] = collect.guarded(lambda: host_time_ms(lambda: model.forward(hidden, plan, last, slots), repeats), ctx.device)
                model.parts, model.last_expert_ids = frozenset(PARTS), step_ids
                extra.update(_parts_extra(name, parts, ctx))
            attn = timed("attn_path_ms", lambda: host_time_ms(lambda: session.layers(plan, last), repeats))
    sb = nbytes.step_bytes(ctx.shape, model.last_expert_ids, cls, ctx.pool.geometry, last)
    active = sum(int(ids.unique().numel()) for ids in model.last_expert_ids.values())
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    return TpotResult(name, tpot, attn, sb, active, model.kernels, extra=extra, guards=guards)


@dataclass
class TpotContext:
    case: Case
    shape: ModelShape
    device: torch.device
    backend: object
    pool: KVPool
    schedule: object
    data: object
    weights: object
    allreduce: AllReduce
    weight_sets: int
    shared_parts: dict = field(default_factory=dict)  # component -> (samples, guard), timed once per run
    unsupported: dict = field(default_factory=dict)  # each strategy planned for -> why it cannot run here (None: it runs)


def build_context(case: Case, shape: ModelShape, device, backend_name: str, weight_sets: int, allreduce: AllReduce, seed: int = 0,
                  strategies=(), check_rotation: bool = False) -> TpotContext:
    """The pool, step data, weights and backend of one tpot run; `strategies`: the ones it will time (the largest
    buffer any of them adds is planned with the pool, before anything is allocated); `check_rotation`: rotation_check's
    distinct weights are planned too."""
    shape = shape.for_pool(case.num_layers)
    if shape.preset != case.preset:
        raise HarnessError("--preset", f"the model shape is {shape.preset.name}'s, the case is {case.preset.name}'s")
    if weight_sets < 1:
        raise HarnessError("--weight-sets", f"must be >= 1, got {weight_sets}")
    weight_sets = min(weight_sets, shape.num_layers)  # sets past the layer count rotate nothing more: the same workload
    schedule = case.schedule()
    # the page-aware pool (Case.geometry, from the fidelity work) when this tree has it
    geometry = getattr(case, "geometry", None) or PoolGeometry(case.scale.slots, case.num_layers, case.preset.row_width)
    backend = make_backend(backend_name, device)
    unsupported = {n: REGISTRY[n].unsupported_reason(device, backend) for n in strategies}
    extra = max((REGISTRY[n].extra_bytes(geometry, schedule) for n, why in unsupported.items() if not why), default=0)
    planned = [(f"rotated weights ({weight_sets} set(s): --weight-sets)", rotated_weight_bytes(shape, weight_sets))]
    if check_rotation:  # held beside the rotated sets while rotation_check times the step again
        planned.append((f"distinct weights ({shape.num_layers} sets: --check-rotation)", rotated_weight_bytes(shape, shape.num_layers)))
    case_memory_plan(case, schedule, extra, *planned).check(device)
    pool = KVPool(geometry, case.scenario.seed, device)
    data = make_step_data(case.preset, schedule, pool)
    weights = make_weights(shape, weight_sets, seed, device)
    return TpotContext(case, shape, device, backend, pool, schedule, data, weights, allreduce, weight_sets, unsupported=unsupported)


def rotated_weight_bytes(s: ModelShape, weight_sets: int) -> int:
    n_moe = s.num_layers - s.first_k_dense
    per_moe = nbytes.moe_fixed_bytes(s) + s.n_routed_experts * nbytes.expert_bytes(s)
    return (min(weight_sets, s.num_layers) * nbytes.attn_weight_bytes(s)
            + min(weight_sets, s.first_k_dense) * nbytes.mlp_bytes(s.hidden_size, s.dense_inter)
            + min(weight_sets, n_moe) * per_moe + nbytes.lm_head_bytes(s))


def memory_plan(name: str, pool_bytes: int, slots: int, extra: int, full_rank: int, total: int, weight_sets: int) -> dict:
    """Does `name`'s pool (+ its extra memory) fit beside the rank's FULL weights on a `total`-byte
    device (5% kept for the context, activations and graphs), and what is the largest pool that does?
    A strategy's extra scales with slots unless it declares extra_per_slot = False (gather_cast's
    compact buffer holds a step's rows)."""
    usable = total * 0.95
    per_slot_extra = extra if REGISTRY[name].extra_per_slot else 0
    fixed_extra = extra - per_slot_extra
    per_slot = (pool_bytes + per_slot_extra) / slots
    need = full_rank + pool_bytes + extra
    fits = need <= usable
    slots_fit = max(0, int((usable - full_rank - fixed_extra) // per_slot)) // 64 * 64  # whole pages
    text = (f"{name}: pool {pool_bytes / GIB:.1f} GiB ({slots:,} slots) + strategy {extra / GIB:.1f} GiB"
            f" + full rank weights {full_rank / GIB:.1f} GiB = {need / GIB:.1f} GiB of {usable / GIB:.1f} GiB usable:"
            + (" fits" if fits else f" does NOT fit beside the weights (it was measured with {weight_sets} rotated weight sets)")
            + f"; largest pool that fits: {slots_fit:,} slots")
    return {"device_total_bytes": total, "fits_with_full_weights": fits, "max_slots_with_full_weights": slots_fit, "memory_plan": text}


def fit_note(ctx: TpotContext, name: str) -> dict:
    """Memory plan: would this strategy's pool fit beside the rank's FULL weights (no rotation)?
    What was measured always fit (the run used rotated weight sets); this says what a real rank holds."""
    geometry = ctx.pool.geometry
    full_rank = nbytes.full_rank_weight_bytes(ctx.shape)
    extra = REGISTRY[name].extra_bytes(geometry, ctx.schedule)
    note = {"full_rank_weight_bytes": full_rank, "pool_bytes": geometry.total_bytes, "strategy_extra_bytes": extra}
    if ctx.device.type == "cuda":
        total = torch.cuda.get_device_properties(ctx.device).total_memory
        note.update(memory_plan(name, geometry.total_bytes, geometry.slots, extra, full_rank, total, ctx.weight_sets))
    else:
        note["memory_plan"] = f"{name}: no device memory to plan against on {ctx.device.type}"
    return note


def breakdown_detail(ctx: TpotContext, r: TpotResult, copy_gbps: float | None) -> dict | None:
    """Per component: measured ms, its byte floor (bytes, ms at the copy bandwidth) and ms / floor."""
    parts = r.extra.get("parts_ms")
    if not parts:
        return None
    s, sb = ctx.shape, r.step_bytes
    n_moe = s.num_layers - s.first_k_dense
    moe_bytes = n_moe * nbytes.moe_fixed_bytes(s) + r.active_experts * nbytes.expert_bytes(s)
    floor_bytes = {"gemm": sb.weights - moe_bytes, "moe": moe_bytes, "attention": sb.kv + sb.cast, "allreduce": 0, "other": 0}
    out = {}
    for p in PARTS:
        floor_ms = floor_bytes[p] / (copy_gbps * 1e9) * 1e3 if copy_gbps else None
        if p == "allreduce":
            floor_ms = ctx.allreduce.model_ms(ctx.schedule.steps[-1].batch_size, s.hidden_size, s.num_layers)
        out[p] = {"ms": parts[p], "floor_bytes": floor_bytes[p], "floor_ms": floor_ms,
                  "over_floor": parts[p] / floor_ms if floor_ms else None, "timed_with": r.extra["parts_timed_with"][p],
                  "guard": r.extra["parts_guard"][p]}
    total = sum(v["ms"] for v in out.values())
    graphs = ctx.device.type == "cuda"  # a part's graph holds its kernels only; a CPU part's run is the whole forward loop
    return {"parts": out, "sum_ms": total, "tpot_ms": r.tpot, "unattributed_ms": r.tpot - total, "parts_add_up": graphs,
            "how": ("each component alone as its own CUDA graph over every layer (others replaced by same-shape zeros/identity)"
                    if graphs else "host wall time of each component alone, separate runs that do not add up to TPOT "
                                   "(CPU: a check of the mechanics, not a measurement)")}


def to_rows(ctx: TpotContext, results: list[TpotResult], backend_name: str, copy_gbps: float | None, rotation: dict | None = None) -> list[Row]:
    case = ctx.case
    ident = dict(preset=case.preset.name, scale=case.scale.name, scenario=case.scenario.name, backend=backend_name)
    rows = []
    for r in results:
        if r.unsupported:
            rows.append(Row(strategy=r.strategy, metric="tpot_ms", value=None, detail={"unsupported": r.unsupported}, **ident))
            continue
        sb = r.step_bytes
        moe_layers = ctx.shape.num_layers - ctx.shape.first_k_dense
        mean_active = r.active_experts / moe_layers if moe_layers else 0
        detail = {
            "kernels": r.kernels, "allreduce": ctx.allreduce.describe(), "weight_sets": ctx.weight_sets,
            "layers": ctx.shape.num_layers, "model_source": ctx.shape.source,
            "reuse_distance_over_l2": nbytes.reuse_distance_bytes(ctx.shape, ctx.weight_sets, round(mean_active)) / nbytes.L2_BYTES,
            "mean_active_experts": mean_active, "kv_written": "model kv_a output, RMS-normed, quantized to e4m3",
            **fit_note(ctx, r.strategy), **r.extra, "guard": r.guards["tpot_ms"],
        }
        med = lambda v: statistics.median(v)  # noqa: E731
        rows += [
            Row(strategy=r.strategy, metric="tpot_ms", value=r.tpot, unit="ms", better="lower", iqr=sample_iqr(r.tpot_ms), samples=list(r.tpot_ms),
                detail=detail, **ident),
            Row(strategy=r.strategy, metric="attn_path_ms", value=med(r.attn_path_ms), unit="ms", better="lower", iqr=sample_iqr(r.attn_path_ms),
                samples=list(r.attn_path_ms), detail={"guard": r.guards["attn_path_ms"]}, **ident),
            attn_share_row(ctx, r, ident),
            Row(strategy=r.strategy, metric="step_weight_bytes", value=sb.weights, unit="B", **ident),
            Row(strategy=r.strategy, metric="step_kv_bytes", value=sb.kv, unit="B", **ident),
            Row(strategy=r.strategy, metric="step_cast_bytes", value=sb.cast, unit="B", **ident),
        ]
        bd = breakdown_detail(ctx, r, copy_gbps)
        if bd:
            detail["breakdown"] = bd
        if copy_gbps:
            ar_ms = ctx.allreduce.model_ms(r_batch(ctx), ctx.shape.hidden_size, ctx.shape.num_layers) or 0.0
            roof = sb.total / (copy_gbps * 1e9) * 1e3 + ar_ms
            rows.append(Row(strategy=r.strategy, metric="roofline_ms", value=roof, unit="ms",
                            detail={"copy_gbps": copy_gbps, "bytes_ms": roof - ar_ms, "allreduce_model_ms": ar_ms}, **ident))
            rows.append(Row(strategy=r.strategy, metric="tpot_over_roofline", value=r.tpot / roof, unit="ratio", **ident))
    if rotation:
        rows.append(Row(strategy=rotation["strategy"], metric="rotation_check", value=rotation["ratio"], unit="ratio", detail=rotation, **ident))
    return rows


def attn_share_row(ctx: TpotContext, r: TpotResult, ident: dict) -> Row:
    """attn_path_ms / tpot_ms on CUDA; on CPU null with the reason: there both are host wall times of separate runs
    (as the breakdown's parts are, docs/tpot.md), whose ratio is no share of the step (it can pass 100%)."""
    if ctx.device.type == "cuda":
        return Row(strategy=r.strategy, metric="attn_share", value=r.attn_share, unit="ratio", **ident)
    why = (f"{r.strategy}: on {ctx.device.type} attn_path_ms and tpot_ms are host wall times of separate runs, "
           "their ratio no share of the step (CUDA only)")
    return Row(strategy=r.strategy, metric="attn_share", value=None, detail={"unsupported": why}, **ident)


def r_batch(ctx: TpotContext) -> int:
    return ctx.schedule.steps[-1].batch_size


def refuse_one_workload_rotation(layers: int, weight_sets: int) -> None:
    """Before any work: --check-rotation where the rotated sets already give every layer its own would time one
    workload twice, a check that cannot fail."""
    if weight_sets >= layers:
        fix = f"--weight-sets below {layers}, or more --layers" if layers > 1 else "more --layers"
        raise HarnessError("--check-rotation", f"--weight-sets {weight_sets} over {layers} layer(s) already gives every layer "
                                               f"its own weights: rotated and distinct would be one workload (pass {fix})")


def rotation_check(ctx: TpotContext, strategy: str, repeats: int, seed: int = 0) -> dict:
    """TPOT with the rotated weight sets and with every layer's weights distinct, on the same pool. Fails (CheckFailed)
    unless the distinct step reads a set per layer and kind and the rotated one fewer: else both time one workload."""
    from dataclasses import replace

    layers = ctx.shape.num_layers
    distinct_ctx = replace(ctx, weights=make_weights(ctx.shape, layers, seed + 1, ctx.device), weight_sets=layers)
    sets_read = {"rotated": ctx.weights.sets_read(ctx.shape), "distinct": distinct_ctx.weights.sets_read(ctx.shape)}
    if not sets_read["rotated"] < sets_read["distinct"] == 2 * layers:
        raise CheckFailed(f"rotation check: over {layers} layers the rotated step reads {sets_read['rotated']} weight sets and "
                          f"the distinct one {sets_read['distinct']} (want fewer than {2 * layers}, and {2 * layers}): one workload timed twice")
    rotated = time_strategy(strategy, ctx, repeats)
    distinct = time_strategy(strategy, distinct_ctx, repeats)
    del distinct_ctx
    return {
        "strategy": strategy, "layers": layers, "weight_sets": ctx.weight_sets, "sets_read": sets_read,
        "rotated_ms": rotated.tpot, "distinct_ms": distinct.tpot, "ratio": rotated.tpot / distinct.tpot,
        "rotated_samples": rotated.tpot_ms, "distinct_samples": distinct.tpot_ms,
        "rotated_guard": rotated.guards["tpot_ms"], "distinct_guard": distinct.guards["tpot_ms"],
    }
