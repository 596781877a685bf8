"""The main job: build the pool, run every strategy on the same queries, check, time, report."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import safetensors.torch
import torch
from rich.console import Console

from harness.errors import CheckFailed, HarnessError, out_of_memory
from harness.execute.decode import Outputs
from harness.execute.prepared import PreparedCase
from harness.fsio import write_files
from harness.inputs.cases import Case, golden_case_names
from harness.measure import timing
from harness.measure.collect import Measured, measure, one_line
from harness.progress import progress_bar
from harness.results.document import Row
from harness.results.metrics import spec as metric_spec
from harness.spec.schedule import least_pool
from harness.strategies import BASELINE, ORDER, REGISTRY
from harness.verify import golden
from harness.verify.check import Status, Verdict, agreement_tolerance, check_against_golden, check_agreement, check_bitwise, combine, policy


@dataclass
class RunConfig:
    case: Case
    device: torch.device
    backend: str = "auto"
    kernel: str = "auto"  # FlashInfer kernel: auto (arch policy), fa3, fa2
    strategies: tuple[str, ...] = field(default_factory=lambda: tuple(ORDER))  # every registered strategy
    faults: frozenset = frozenset()
    repeats: int = 5
    reference: str = "auto"  # "golden", "live", or "auto" (golden when the case has one)
    dump_outputs: Path | None = None
    obtained: bool = True  # a strategy that misses its stored golden leaves its obtained file beside it


@dataclass
class StrategyResult:
    strategy: str
    verdict: Verdict
    metrics: dict[str, timing.Samples] = field(default_factory=dict)
    extra_bytes: int | None = None
    peak_bytes: int | None = None
    skipped: dict[str, str] = field(default_factory=dict)  # metric -> why it was not measured
    outputs: Outputs | None = None  # (out, lse) of the checked layers, for callers that inspect them
    guards: dict[str, dict] = field(default_factory=dict)  # metric -> clock guard of its timing block


LIVE_REFERENCE = "live float64 reference"


def _reference(cfg: RunConfig, console: Console) -> tuple[golden.GoldenData, str]:
    """The golden of the case when one matches it exactly (same scale and scenario), else a live reference; and what
    it is: the golden's folder (as configured: --golden-dir, MLA_HARNESS_GOLDEN_DIR or the checkout's), or
    LIVE_REFERENCE."""
    case = cfg.case
    why, names = ("--reference live" if cfg.reference == "live" else f"no golden for {case.name}"), []
    if cfg.reference != "live":
        try:
            names = golden_case_names()
        except HarnessError as exc:  # no golden folder at all (a non-editable install): auto goes live
            if cfg.reference == "golden" or exc.where != "golden":
                raise
            why = "no golden directory (--golden-dir, MLA_HARNESS_GOLDEN_DIR)"
    if case.name in names:
        gold, folder = golden.load(case.name), golden.case_dir(case.name)
        mismatch = golden.spec_mismatch(gold, case)
        if not mismatch:
            if stale := golden.case_mismatch(gold, case):
                raise HarnessError(str(folder / golden.MANIFEST), f"{stale}: a stale or edited golden "
                                   "(python -m harness golden verify)")
            if gap := golden.coverage_gap(gold, case):
                raise HarnessError(str(folder), f"does not cover the case: {gap}")
            return gold, str(folder)
        why = f"{folder} is for another {mismatch}"
    if cfg.reference == "golden":
        raise HarnessError("--reference", f"{why}; use --reference live (or auto)")
    console.print(f"{why}: checking against a live float64 reference", style="yellow", markup=False)
    n = len(cfg.case.checked_layers()) * cfg.case.scenario.steps
    with progress_bar(console, "float64 reference", n) as advance:
        return golden.compute(cfg.case, progress=advance), LIVE_REFERENCE


def _verdict(name, backend_name, outputs: Outputs, gold: golden.GoldenData, baseline: Outputs | None, tier,
             baseline_unsupported: str = "") -> Verdict:
    """Golden check of every checked (step, layer) at the golden's requests; against the baseline (stock) at every
    request: bitwise equality for the bitwise tier, agreement within both policies for the tolerance tier. Without
    the baseline's outputs the bitwise tier fails; the tolerance tier keeps its golden verdict, saying what went
    unchecked, only where the baseline cannot run here (`baseline_unsupported`: why), e.g. no FlashInfer policy on sm_89."""
    tol = policy(name, backend_name)
    verdicts = []
    if name != BASELINE and baseline is None:
        if tier == "bitwise" or not baseline_unsupported:
            verdicts.append(Verdict(Status.FAIL, f"{tier} tier not checked at every request: {BASELINE} produced no outputs"))
        else:
            verdicts.append(Verdict(Status.PASS, f"requests outside the golden unchecked: {BASELINE} is unsupported here "
                                                 f"({baseline_unsupported})"))
    agree = agreement_tolerance(tol, policy(BASELINE, backend_name))
    for step, layer in gold.keys():
        out, lse = outputs[(step, layer)]
        pos = torch.as_tensor(gold.positions(step))
        verdicts.append(check_against_golden(out[pos], lse[pos], gold.out(step, layer), gold.lse(step, layer), tol))
        if name != BASELINE and baseline is not None:
            check = check_bitwise(out, lse, *baseline[(step, layer)], BASELINE) if tier == "bitwise" else \
                check_agreement(out, lse, *baseline[(step, layer)], agree, BASELINE)
            verdicts.append(check)
    return combine(verdicts)


def _obtained(outputs: Outputs, gold: golden.GoldenData) -> dict[str, torch.Tensor]:
    """A strategy's outputs at the golden's checked rows, keyed as the golden's outputs file."""
    tensors = {}
    for step, layer in gold.keys():
        out, lse = outputs[(step, layer)]
        pos = torch.as_tensor(gold.positions(step))
        tensors[f"s{step}.positions"] = pos
        tensors[f"s{step}.l{layer}.out_bf16"], tensors[f"s{step}.l{layer}.lse"] = out[pos].cpu(), lse[pos].cpu()
    return tensors


@dataclass
class RunOutcome:
    results: list[StrategyResult]
    backend: str
    pool_build_s: float
    reference: str = ""  # what the verdicts were checked against: the golden's folder and manifest_sha256, or the live reference


def _wanted(cfg: RunConfig) -> list[str]:
    """The requested strategies, the baseline first when another is requested: every strategy is checked against it
    at every request (the golden stores a few)."""
    wanted = list(dict.fromkeys(cfg.strategies))
    if BASELINE not in wanted:
        wanted.insert(0, BASELINE)
    return wanted


def _check_memory(prep: PreparedCase, runnable: list[str], console: Console) -> None:
    plan = prep.memory_plan(runnable)
    console.print(f"memory plan: {plan.describe()}")
    plan.check(prep.device, needed=least_pool(prep.case.scenario, prep.case.preset.page_size))


def _build(prep: PreparedCase, console: Console) -> None:
    g = prep.geometry
    with progress_bar(console, f"fp8 pool {g.slots:,} slots x {g.num_layers} layers", g.num_layers) as advance:
        prep.build(progress=lambda *_: advance())
    console.print(f"pool built in {prep.build_s:.2f} s ({g.total_bytes / 1e9:.1f} GB)")


def _execute(prep: PreparedCase, name: str, cfg: RunConfig, console: Console):
    """(outputs, Measured, peak bytes, exactness tier) of one strategy; a crash raises, OOM included."""
    device, record = prep.device, set(prep.case.checked_layers())
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base_mem = torch.cuda.memory_allocated(device)
    measured, peak = Measured(), None
    with prep.session(name) as session:
        strategy = session.strategy
        with progress_bar(console, f"{name}: decode", len(prep.schedule.steps)) as advance:
            outputs = session.run_all(record, progress=advance)
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device) - base_mem
        if cfg.repeats:
            try:
                measured = measure(session, cfg.repeats, partial(progress_bar, console, f"{name}: timing, {cfg.repeats} samples per metric"))
            except Exception as exc:  # timing trouble never hides a finished verdict
                if out_of_memory(exc):
                    raise
                measured = Measured(skipped={"timing": one_line(exc)})
    return outputs, measured, peak, strategy.run_tier()  # after teardown: what the whole run found


def run(cfg: RunConfig, console: Console) -> RunOutcome:
    """Run the configured strategies on one case: per-strategy verdicts and metrics."""
    prep = PreparedCase(cfg.case, cfg.device, cfg.backend, cfg.kernel, cfg.faults)
    wanted, results = _wanted(cfg), {}
    for name in wanted:
        if reason := prep.unsupported_reason(name):
            results[name] = StrategyResult(name, Verdict(Status.UNSUPPORTED, reason))
    runnable = [n for n in wanted if n not in results]
    if not runnable:
        reasons = "; ".join(f"{r.strategy}: {r.verdict.reason}" for r in results.values())
        raise CheckFailed(f"no strategy can run here, nothing was checked ({reasons})")
    _check_memory(prep, runnable, console)
    gold, ref_label = _reference(cfg, console)
    _build(prep, console)
    baseline = None
    for name in sorted(runnable, key=lambda n: n != BASELINE):  # the baseline first: every other's anchor
        try:
            outputs, m, peak, tier = _execute(prep, name, cfg, console)
        except Exception as exc:  # a crashing strategy is a red verdict, the others still run
            if out_of_memory(exc):
                raise  # GPU or host memory: an impossible size, not a kernel bug: the CLI reports it as bad input
            results[name] = StrategyResult(name, Verdict(Status.ERROR, one_line(exc)))
            continue
        baseline = outputs if name == BASELINE else baseline
        unsupported = results[BASELINE].verdict.reason if BASELINE in results and results[BASELINE].verdict.status == Status.UNSUPPORTED else ""
        verdict = _verdict(name, prep.backend.name, outputs, gold, baseline, tier, unsupported)
        if tier != REGISTRY[name].tier:  # said beside the verdict: which exactness this run was held to, and why
            verdict = replace(verdict, reason="; ".join(filter(None, [verdict.reason, f"held to the {tier} tier, not the declared "
                                                                     f"{REGISTRY[name].tier}: set by what this run handed its kernel"])))
        if verdict.status == Status.FAIL and ref_label != LIVE_REFERENCE and cfg.obtained and not cfg.faults:  # a planted fault fails by design
            where = golden.write_obtained(cfg.case.name, name, _obtained(outputs, gold))
            console.print(f"{name}: {where}", markup=False, highlight=False, soft_wrap=True)
            verdict = replace(verdict, reason=f"{verdict.reason}; {where}")
        unmodelled = REGISTRY[name].unmodelled  # its computed extra memory would be the harness's model, not its code's
        skipped = {**m.skipped, **({"extra_bytes": unmodelled} if unmodelled else {})}
        results[name] = StrategyResult(name, verdict, m.metrics, None if unmodelled else prep.extra_bytes(name), peak, skipped,
                                       outputs, m.guards)
    if cfg.dump_outputs is not None:  # all at once after the last strategy: an interrupted or failed run leaves the old dumps
        dump({cfg.dump_outputs / f"{cfg.case.name}.{r.strategy}.safetensors": r.outputs for r in results.values() if r.outputs is not None})
    console.print(f"checked against {ref_label}", markup=False)
    reference = f"{Path(ref_label).resolve()} (manifest_sha256 {gold.manifest['manifest_sha256']})" if ref_label != LIVE_REFERENCE else ref_label
    return RunOutcome([results[n] for n in wanted], prep.backend.name, prep.build_s, reference)


def dump(dumps: dict[Path, Outputs]) -> None:
    """Write each path's outputs (on the host, as every result keeps them) as safetensors, all staged before any is moved
    in: serializing adds one host copy of every strategy's checked outputs (outputs_bytes each: 4 MiB at glm5-tp8 b128-l2048)."""
    files = {}
    for path, outputs in dumps.items():
        tensors = {}
        for (step, layer), (out, lse) in outputs.items():
            tensors[f"s{step}.l{layer}.out"] = out.contiguous()
            tensors[f"s{step}.l{layer}.lse"] = lse.contiguous()
        files[path] = safetensors.torch.save(tensors)
    write_files(files, "--dump-outputs")


def to_rows(case: Case, outcome: RunOutcome) -> list[Row]:
    ident = dict(preset=case.preset.name, scale=case.scale.name, scenario=case.scenario.name, backend=outcome.backend)
    # one host-timed sample including kernel loading: informational, not gated
    rows = [Row(strategy="pool", metric="build_s", value=outcome.pool_build_s, unit="s", **ident)]
    for r in outcome.results:
        rows.append(Row(strategy=r.strategy, metric="verdict", value=r.verdict.status.value, detail=r.verdict.to_dict(), **ident))
        for metric, s in r.metrics.items():
            better = metric_spec(metric).better
            guard = {"guard": r.guards[metric]} if metric in r.guards else None
            rows.append(Row(strategy=r.strategy, metric=metric, value=s.median, unit=s.unit, better=better, iqr=s.iqr,
                            samples=list(s.values), detail=guard, **ident))
        for metric, why in r.skipped.items():
            rows.append(Row(strategy=r.strategy, metric=metric, value=None, detail={"unsupported": why}, **ident))
        if r.extra_bytes is not None:
            rows.append(Row(strategy=r.strategy, metric="extra_bytes", value=r.extra_bytes, unit="B", better="lower", **ident))
        if r.peak_bytes is not None:
            rows.append(Row(strategy=r.strategy, metric="peak_bytes", value=r.peak_bytes, unit="B", better="lower", **ident))
    return rows
