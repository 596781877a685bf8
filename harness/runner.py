"""The main job: build the pool, run every strategy on the same queries, check, time, report."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import safetensors.torch
import torch
from rich.console import Console

from harness import golden, timing
from harness.backends import make_backend
from harness.cases import Case, golden_case_names
from harness.errors import CheckFailed, HarnessError
from harness.check import Status, Verdict, check_against_golden, check_bitwise, combine, policy
from harness.decode import DecodeSession, Outputs, make_step_data
from harness.faults import FAULT_TARGET
from harness.fsio import write_bytes
from harness.memory import MemoryPlan
from harness.pool import KVPool, PoolGeometry
from harness.progress import progress_bar
from harness.results import Row
from harness.strategies import ORDER, REGISTRY


@dataclass
class RunConfig:
    case: Case
    device: torch.device
    backend: str = "auto"
    strategies: tuple[str, ...] = ORDER
    faults: frozenset = frozenset()
    repeats: int = 5
    reference: str = "auto"  # "golden", "live", or "auto" (golden when the case has one)
    dump_outputs: Path | None = None


@dataclass
class StrategyResult:
    strategy: str
    verdict: Verdict
    metrics: dict[str, timing.Samples] = field(default_factory=dict)
    extra_bytes: int | None = None
    peak_bytes: int | None = None
    skipped: dict[str, str] = field(default_factory=dict)  # metric -> why it was not measured
    outputs: Outputs | None = None  # (out, lse) of the checked layers, for callers that inspect them


def _reference(cfg: RunConfig, console: Console) -> tuple[golden.GoldenData, str]:
    """The golden of the case when one matches it exactly (same scale and scenario), else a live reference."""
    case = cfg.case
    why = "--reference live" if cfg.reference == "live" else f"no golden for {case.name}"
    if cfg.reference != "live" and case.name in golden_case_names():
        gold = golden.load(case.name)
        mismatch = golden.spec_mismatch(gold, case)
        if not mismatch:
            if gap := golden.coverage_gap(gold, case):
                raise HarnessError(f"golden/{case.name}", f"does not cover the case: {gap}")
            return gold, f"golden/{case.name}"
        why = f"golden/{case.name} is for another {mismatch}"
    if cfg.reference == "golden":
        raise HarnessError("--reference", f"{why}; use --reference live (or auto)")
    console.print(f"[yellow]{why}: checking against a live float64 reference[/]")
    n = len(cfg.case.checked_layers()) * cfg.case.scenario.steps
    with progress_bar(console, "float64 reference", n) as advance:
        return golden.compute(cfg.case, progress=advance), "live float64 reference"


def _verdict(name, backend_name, outputs: Outputs, gold: golden.GoldenData, stock: Outputs | None, tier) -> Verdict:
    """Golden check of every checked (step, layer); bitwise equality with stock for the bitwise tier."""
    tol = policy(name, backend_name)
    verdicts = []
    if tier == "bitwise" and name != "stock" and stock is None:
        verdicts.append(Verdict(Status.FAIL, "bitwise tier not checked: stock produced no outputs"))
    for step, layer in gold.keys():
        out, lse = outputs[(step, layer)]
        pos = torch.as_tensor(gold.positions(step))
        verdicts.append(check_against_golden(out[pos], lse[pos], gold.out(step, layer), gold.lse(step, layer), tol))
        if tier == "bitwise" and name != "stock" and stock is not None:
            verdicts.append(check_bitwise(out, lse, *stock[(step, layer)], "stock"))
    return combine(verdicts)


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:160] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


def _measure(session: DecodeSession, repeats: int) -> tuple[dict[str, timing.Samples], dict[str, str]]:
    """Metrics of the last step. cast_us and attn_us: layer 0's cast/gather kernel and attention
    kernel alone. step_ms: one whole decode step (host re-plan + all layers; on CUDA one graph
    replay of the captured layer loop, as a CUDA-graph server runs it); step_eager_ms: the same
    loop launched eagerly. Returns (metrics, {metric: why it was not measured})."""
    s, last = session.strategy, session.schedule.steps[-1]
    plan = s.begin_step(last)
    q = session.data.queries[(last.step, 0)]
    kv = s.prepare_kv(0)
    fn, tensors = s.cast_call(0)
    cast_bytes = type(s).cast_bytes(s.pool.geometry, last)
    has_cast = cast_bytes > 0
    skipped: dict[str, str] = {} if has_cast else {"cast_us": f"{s.name} has no per-step cast kernel"}
    ms: dict[str, list[float]] = {}
    if s.device.type != "cuda":
        if has_cast:
            ms["cast_us"] = timing.host_time_ms(lambda: fn(*tensors), repeats)
        ms["attn_us"] = timing.host_time_ms(lambda: s.attend(plan, *q, kv), repeats)
        ms["step_ms"] = timing.host_time_ms(lambda: session.step(last), repeats)
    else:
        if has_cast:
            ms["cast_us"] = timing.device_time_ms(fn, repeats, use_cuda_graph=True, input_args=tensors)
        attend = lambda qn, qp, ckv, kpe: s.attend(plan, qn, qp, (ckv, kpe))  # noqa: E731
        ms["attn_us"] = timing.device_time_ms(attend, repeats, use_cuda_graph=True, input_args=(*q, *kv))
        ms["step_eager_ms"] = timing.device_time_ms(lambda: session.step(last), repeats)
        try:
            gplan, graph = session.capture_step(last)

            def replay():
                s.replan_step(gplan, last)
                graph.replay()

            ms["step_ms"] = timing.device_time_ms(replay, repeats)
        except Exception as exc:  # a backend or strategy that cannot be captured is reported, not fatal
            skipped["step_ms"] = f"not graph-capturable: {_one_line(exc)}"
    metrics = {
        k: timing.Samples("ms", tuple(v)) if k.startswith("step") else timing.Samples("us", tuple(t * 1e3 for t in v))
        for k, v in ms.items()
    }
    if has_cast:
        metrics["cast_gbps"] = timing.Samples("GB/s", tuple(cast_bytes / (t * 1e-6) / 1e9 for t in metrics["cast_us"].values))
    return metrics, skipped


@dataclass
class RunOutcome:
    results: list[StrategyResult]
    backend: str
    pool_build_s: float


def run(cfg: RunConfig, console: Console) -> RunOutcome:
    """Run the configured strategies on one case: per-strategy verdicts and metrics."""
    case, device = cfg.case, cfg.device
    schedule = case.schedule()
    backend = make_backend(cfg.backend, device)
    geometry = PoolGeometry(case.scale.slots, case.num_layers, case.preset.row_width)
    runnable, results = [], []
    wanted = list(dict.fromkeys(cfg.strategies))
    if "stock" not in wanted and any(REGISTRY[n].tier == "bitwise" for n in wanted):
        wanted.insert(0, "stock")  # the anchor of the bitwise tier always runs
    for name in wanted:
        reason = REGISTRY[name].unsupported_reason(device, backend)
        if reason:
            results.append(StrategyResult(name, Verdict(Status.UNSUPPORTED, reason)))
        else:
            runnable.append(name)
    if not runnable:
        reasons = "; ".join(f"{r.strategy}: {r.verdict.reason}" for r in results)
        raise CheckFailed(f"no strategy can run here, nothing was checked ({reasons})")
    extra = max((REGISTRY[n].extra_bytes(geometry, schedule) for n in runnable), default=0)
    per_slot = -(-(geometry.total_bytes + extra) // geometry.slots)  # conservative: all of it scales with slots
    plan = MemoryPlan((("fp8 pool", geometry.total_bytes), ("largest strategy buffer", extra)), per_slot, geometry.slots)
    console.print(f"memory plan: {plan.describe()}")
    plan.check(device)
    gold, ref_label = _reference(cfg, console)
    with progress_bar(console, f"fp8 pool {geometry.slots:,} slots x {geometry.num_layers} layers", geometry.num_layers) as advance:
        t0 = time.perf_counter()
        pool = KVPool(geometry, case.scenario.seed, device, progress=lambda *_: advance())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        build_s = time.perf_counter() - t0
    console.print(f"pool built in {build_s:.2f} s ({geometry.total_bytes / 1e9:.1f} GB)")
    data = make_step_data(case.preset, schedule, pool, cfg.faults)
    record = set(case.checked_layers())
    stock_outputs = None
    for name in sorted(runnable, key=lambda n: n != "stock"):  # stock first: the bitwise anchor
        cls = REGISTRY[name]
        faults = frozenset(f for f in cfg.faults if FAULT_TARGET[f] in (None, name))
        strategy = cls(pool, backend, case.preset, faults)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base_mem = torch.cuda.memory_allocated(device)
        metrics, skipped, peak = {}, {}, None
        try:
            with progress_bar(console, f"{name}: decode", len(schedule.steps)) as advance, DecodeSession(strategy, schedule, data) as session:
                outputs = session.run_all(record, progress=advance)
                if device.type == "cuda":
                    peak = torch.cuda.max_memory_allocated(device) - base_mem
                if cfg.repeats:
                    try:
                        metrics, skipped = _measure(session, cfg.repeats)
                    except torch.cuda.OutOfMemoryError:
                        raise
                    except Exception as exc:  # timing trouble never hides a finished verdict
                        skipped = {"timing": _one_line(exc)}
        except torch.cuda.OutOfMemoryError:
            raise  # an impossible size, not a kernel bug: the CLI reports it as bad input
        except Exception as exc:  # a crashing strategy is a red verdict, the others still run
            results.append(StrategyResult(name, Verdict(Status.ERROR, _one_line(exc))))
            continue
        if name == "stock":
            stock_outputs = outputs
        verdict = _verdict(name, backend.name, outputs, gold, stock_outputs, cls.tier)
        results.append(StrategyResult(name, verdict, metrics, cls.extra_bytes(geometry, schedule), peak, skipped, outputs))
        if cfg.dump_outputs is not None:
            dump(outputs, cfg.dump_outputs / f"{case.name}.{name}.safetensors")
    order = {n: i for i, n in enumerate(wanted)}
    results.sort(key=lambda r: order[r.strategy])
    console.print(f"checked against {ref_label}")
    return RunOutcome(results, backend.name, build_s)


def dump(outputs: Outputs, path: Path) -> None:
    tensors = {}
    for (step, layer), (out, lse) in outputs.items():
        tensors[f"s{step}.l{layer}.out"] = out.contiguous()
        tensors[f"s{step}.l{layer}.lse"] = lse.contiguous()
    write_bytes(path, safetensors.torch.save(tensors))


def to_rows(case: Case, outcome: RunOutcome) -> list[Row]:
    ident = dict(preset=case.preset.name, scale=case.scale.name, scenario=case.scenario.name, backend=outcome.backend)
    # one host-timed sample including kernel loading: informational, not gated
    rows = [Row(strategy="pool", metric="build_s", value=outcome.pool_build_s, unit="s", **ident)]
    for r in outcome.results:
        rows.append(Row(strategy=r.strategy, metric="verdict", value=r.verdict.status.value, detail=r.verdict.to_dict(), **ident))
        for metric, s in r.metrics.items():
            better = "higher" if metric.endswith("gbps") else "lower"
            rows.append(Row(strategy=r.strategy, metric=metric, value=s.median, unit=s.unit, better=better, iqr=s.iqr, samples=list(s.values), **ident))
        for metric, why in r.skipped.items():
            rows.append(Row(strategy=r.strategy, metric=metric, value=None, detail={"unsupported": why}, **ident))
        if r.extra_bytes is not None:
            rows.append(Row(strategy=r.strategy, metric="extra_bytes", value=r.extra_bytes, unit="B", better="lower", **ident))
        if r.peak_bytes is not None:
            rows.append(Row(strategy=r.strategy, metric="peak_bytes", value=r.peak_bytes, unit="B", better="lower", **ident))
    return rows
