#!/usr/bin/env python3
"""A/A and planted-slowdown experiment for `harness compare` (issue: gate trust). GPU; ~5 min on an H200.

usage: python -m ci.experiments.gate OUT_DIR [--scenario NAME ...] [--pairs 5] [--repeats 30]
                                    [--strategy gather_cast] [--device cuda] [--scale prod] [--plant 0.1 ...] [--keep-docs]

For each headline scenario (glm5-tp8, production scale) one pool, one set of step data and one
decode session of one strategy are built; then measurement blocks run in the order
A, B, A, B, ... Each block is the harness's own measurement (`harness.measure.collect.measure`: every
metric a `harness run` reports, on a freshly captured bucket graph) plus the control copy, written as a
results document exactly as `harness run --json` writes it, and each (A, B) pair is judged by
`harness.gate.compare.compare_results` at the default 5% tolerance:

- A/A: B is the same code: no gating metric may come out `regressed`;
- planted 10% / 5%: B's step graph replay is followed by an extra copy kernel
  (an extra device-to-device copy, calibrated in bytes per ms on this GPU) lasting 10% / 5% of A's
  median step: real GPU work inside the timed region, not an edited number. 10% must be
  `regressed` in every pair; 5% `regressed` or `inconclusive` with MDE <= 5% (or `slower`),
  never `unchanged`.

Independence: the pairs share the process, pool and step data (rebuilding a 22 GB pool per
block would cost the whole GPU budget), but every block captures its own CUDA graph, re-plans,
re-times every metric with its own warm-up, and A and B alternate, so a drift in clocks or
temperature lands on both sides instead of on one. What this does not cover is
process-to-process variance (allocator placement, JIT state), which two separate `harness
run` processes would add; the clock guard and the control row are the gate's defence there.

Writes OUT_DIR/gate-experiment.md (the tables) and OUT_DIR/gate-experiment.json (every pair's
statuses, ratios, intervals); exits 0 when every criterion holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from harness.execute.decode import DecodeSession  # noqa: E402
from harness.execute.prepared import PreparedCase  # noqa: E402
from harness.gate.compare import compare_results  # noqa: E402
from harness.inputs.cases import Case  # noqa: E402
from harness.measure.collect import measure  # noqa: E402
from harness.measure.control import control_row, copy_bytes_per_ms  # noqa: E402
from harness.measure.environment import environment  # noqa: E402
from harness.results.document import Row, case_record, document  # noqa: E402
from harness.results.metrics import METRICS  # noqa: E402
from harness.spec.presets import get_preset, get_scale  # noqa: E402
from harness.spec.scenario import load_scenario  # noqa: E402

HEADLINE = ("b1-l500", "b1-l4096", "b32-l4096", "b128-l2048")
PLANTS = (0.10, 0.05)
TOLERANCE = 0.05
STEP_METRICS = ("step_device_ms", "step_ms")  # the planted metric: graph replay alone when measured apart


def plant(session: DecodeSession, nbytes: int) -> None:
    """Make every bucket graph of this session copy `nbytes` more on the GPU after its replay: a
    memory-bound kernel whose time, unlike a clock-cycle spin, does not move with the SM clock."""
    bucket_graph = type(session).bucket_graph
    src = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=session.strategy.device)
    dst = torch.empty_like(src)

    class SlowerGraph:
        def __init__(self, graph):
            self.graph = graph

        def replay(self):
            out = self.graph.replay()
            dst.copy_(src)
            return out

        def __getattr__(self, name):
            return getattr(self.graph, name)

    session.bucket_graph = lambda batch, record_layers=(): SlowerGraph(bucket_graph(session, batch, record_layers))


def unplant(session: DecodeSession) -> None:
    session.__dict__.pop("bucket_graph", None)


def block(case: Case, session: DecodeSession, backend: str, env: dict, repeats: int) -> dict:
    """One measurement block as a results document (the rows `harness run --json` writes)."""
    session._graphs.clear()  # every block captures its own graph
    measured = measure(session, repeats)
    metrics, skipped = measured.metrics, measured.skipped
    ident = dict(preset=case.preset.name, scale=case.scale.name, scenario=case.scenario.name, backend=backend)
    rows = [Row(strategy=session.strategy.name, metric=m, value=s.median, unit=s.unit, iqr=s.iqr,
                samples=list(s.values), **ident) for m, s in metrics.items()]
    rows.append(control_row(ident, session.strategy.device))
    return {**document(rows, env, "", case_record(case, backend, "auto")), "skipped": skipped}


def keep(args, stem: str, a: dict, b: dict) -> None:
    """With --keep-docs, each pair's two results documents, for `harness compare` to judge from the files."""
    if args.keep_docs:
        for side, doc in (("a", a), ("b", b)):
            (args.out / "docs" / f"{stem}-{side}.json").write_text(json.dumps(doc, default=str))


def step_metric(doc: dict) -> str:
    present = {r["metric"] for r in doc["rows"]}
    return next(m for m in STEP_METRICS if m in present)


def judge(base: dict, head: dict, metric: str | None = None) -> dict:
    comparison = compare_results(base, head, TOLERANCE)
    gating = [c for c in comparison.changes if c.gating]
    out = {
        "exit": comparison.exit_code,
        "gating": len(gating),
        "regressed": [c.key[5] for c in comparison.regressions],
        "inconclusive": [c.key[5] for c in comparison.unjudged],
        "environment_differs": comparison.environment_differs,
        "rows": [dict(metric=c.key[5], status=c.status, ratio=c.ratio,
                      low=c.decision.low if c.decision else None, high=c.decision.high if c.decision else None)
                 for c in gating],  # every gating row's verdict: an A/A false alarm can be read back
    }
    if metric:
        (c,) = [c for c in comparison.changes if c.key[5] == metric]
        d = c.decision
        out.update(metric=metric, status=c.status, gating_metric=c.gating, ratio=c.ratio,
                   low=d.low if d else None, high=d.high if d else None, mde=d.mde if d else None)
    return out


def spread(doc: dict) -> dict[str, float]:
    """IQR/median of every timed metric of one block."""
    return {r["metric"]: r["iqr"] / r["value"] for r in doc["rows"]
            if METRICS[r["metric"]].timed and r["value"] and r.get("iqr") is not None}


def run_scenario(name: str, args, env: dict, bytes_per_ms: float | None) -> dict:
    case = Case(get_preset("glm5-tp8"), get_scale(args.scale), load_scenario(name))
    device = torch.device(args.device)
    t0 = time.perf_counter()
    prepared = PreparedCase(case, device).build()
    backend = prepared.backend
    result = {"scenario": name, "aa": [], "planted": [], "spread": []}
    with prepared.session(args.strategy) as session:
        session.run_all(())
        for i in range(args.pairs):  # A/A: A, B, A, B, ...
            a = block(case, session, backend.name, env, args.repeats)
            b = block(case, session, backend.name, env, args.repeats)
            result["aa"].append(judge(a, b))
            keep(args, f"{name}-aa{i}", a, b)
            result["spread"] += [spread(a), spread(b)]
        metric = step_metric(a)
        step_ms = statistics.median([r["value"] for r in a["rows"] if r["metric"] == metric])
        for fraction in args.plant if bytes_per_ms is not None else ():  # planting needs CUDA events
            for i in range(args.pairs):
                a = block(case, session, backend.name, env, args.repeats)
                plant(session, int(fraction * step_ms * bytes_per_ms))
                try:
                    b = block(case, session, backend.name, env, args.repeats)
                finally:
                    unplant(session)
                result["planted"].append({"fraction": fraction, **judge(a, b, metric)})
                keep(args, f"{name}-planted{round(fraction * 100)}pct-{i}", a, b)
    result["seconds"] = time.perf_counter() - t0
    del session, prepared
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def criteria(results: list[dict]) -> list[str]:
    """Every criterion that failed, as one line each (empty: all hold)."""
    failed = []
    for r in results:
        for i, p in enumerate(r["aa"]):
            if p["regressed"] or p["exit"] == 1:
                failed.append(f"{r['scenario']} A/A pair {i}: regressed {p['regressed']} (exit {p['exit']})")
        for p in r["planted"]:
            found = p["status"] in ("regressed", "worse")  # "worse": compare's word when the metric does not gate
            ok = found if p["fraction"] >= 0.10 else (
                found or p["status"] == "slower" or (p["status"] == "inconclusive" and (p["mde"] or 1) <= 0.05))
            if not ok:
                failed.append(f"{r['scenario']} planted {p['fraction']:.0%}: {p['metric']} {p['status']} "
                              f"(ratio {p['ratio']:.3f}, MDE {p['mde']})")
    return failed


def _f(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(results: list[dict], args, env: dict, failed: list[str]) -> str:
    lines = [
        "# Gate experiment: A/A and planted slowdown",
        "",
        f"GPU {env.get('gpu')} · commit {env.get('git_commit')} · strategy {args.strategy} · {args.pairs} pairs · "
        f"{args.repeats} samples per metric · tolerance {TOLERANCE:.0%} · `python -m ci.experiments.gate`",
        "",
        "## A/A (same code, blocks A, B interleaved)",
        "",
        "| scenario | pairs | gating rows per pair | pairs with a regressed gating metric | inconclusive gating rows | environment differs | largest A/A ratio (99% CI) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        aa = r["aa"]
        rows = [row for p in aa for row in p.get("rows", [])]
        worst = max(rows, key=lambda row: row["ratio"], default=None)
        worst_text = (f"{worst['metric']} {worst['ratio']:.3f} ({_f(worst['low'], '.3f')}-{_f(worst['high'], '.3f')})"
                      if worst else "-")
        lines.append(f"| {r['scenario']} | {len(aa)} | {aa[0]['gating'] if aa else '-'} | "
                     f"{sum(bool(p['regressed']) for p in aa)} | {sum(len(p['inconclusive']) for p in aa)} | "
                     f"{sum(bool(p['environment_differs']) for p in aa)} | {worst_text} |")
    lines += ["", "## Planted slowdown (an extra calibrated copy after the step's graph replay)", "",
              "| scenario | planted | metric | pair | ratio | 99% CI | MDE | status |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for i, p in enumerate(r["planted"]):
            ci = f"{p['low']:.3f}-{p['high']:.3f}" if p["low"] is not None else "-"
            mde = f"{p['mde']:.1%}" if p["mde"] is not None else "-"
            lines.append(f"| {r['scenario']} | {p['fraction']:.0%} | {p['metric']}{'' if p['gating_metric'] else ' (info)'} | "
                         f"{i % args.pairs} | {p['ratio']:.3f} | {ci} | {mde} | {p['status']} |")
    lines += ["", "## Spread (IQR/median per block: median and worst over the A/A blocks)", "",
              "| scenario | metric | gates | median | worst |", "|---|---|---|---|---|"]
    for r in results:
        for metric in sorted({m for s in r["spread"] for m in s}):
            values = [s[metric] for s in r["spread"] if metric in s]
            gates = "yes" if METRICS[metric].gates("cuda") else "info"
            lines.append(f"| {r['scenario']} | {metric} | {gates} | {statistics.median(values):.1%} | {max(values):.1%} |")
    lines += ["", "## Verdict", ""]
    lines += [f"- FAILED: {line}" for line in failed] or ["- every criterion holds"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--scenario", action="append", help=f"default: {', '.join(HEADLINE)}")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--strategy", default="gather_cast")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--scale", default="prod")
    parser.add_argument("--plant", type=float, action="append", help=f"planted slowdown fractions (default: {PLANTS})")
    parser.add_argument("--keep-docs", action="store_true", help="write each pair's results documents under OUT/docs/")
    args = parser.parse_args(argv)
    args.plant = tuple(args.plant or PLANTS)
    (args.out / "docs").mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    env = environment(device)
    bytes_per_ms = copy_bytes_per_ms(device) if device.type == "cuda" else None
    results = []
    for name in args.scenario or HEADLINE:
        try:
            results.append(run_scenario(name, args, env, bytes_per_ms))
            print(f"{name}: done in {results[-1]['seconds']:.0f} s", flush=True)
        except Exception as exc:  # one scenario failing must not lose the others' evidence
            print(f"{name}: FAILED: {type(exc).__name__}: {exc}", flush=True)
            results.append({"scenario": name, "aa": [], "planted": [], "spread": [], "error": f"{type(exc).__name__}: {exc}"})
        failed = write(args, env, bytes_per_ms, results)  # after each scenario: a timeout keeps what was done
    print((args.out / "gate-experiment.md").read_text())
    return 1 if failed else 0


def write(args, env: dict, bytes_per_ms: float | None, results: list[dict]) -> list[str]:
    """Write the markdown and JSON for the scenarios done so far; return the failed criteria."""
    failed = criteria(results) + [f"{r['scenario']}: {r['error']}" for r in results if "error" in r]
    (args.out / "gate-experiment.json").write_text(json.dumps(
        {"bytes_per_ms": bytes_per_ms, "environment": env, "results": results, "failed": failed}, indent=1, default=str))
    (args.out / "gate-experiment.md").write_text(markdown(results, args, env, failed))
    return failed


if __name__ == "__main__":
    sys.exit(main())
