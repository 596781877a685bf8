"""One list: every metric that gates on CUDA is tracked by an asv benchmark (a class in suites/asv/ named after
it, as ci.asv_gate reads it) or says in harness/results/metrics.py why not (`no_asv`)."""

import ast
import dataclasses
from pathlib import Path

from ci.asv_gate import metric_of
from harness.results.metrics import METRICS, Metric

ASV = Path(__file__).resolve().parent / "asv"


def asv_metrics() -> set[str]:
    """The metrics the asv benchmark classes measure (every class, nested ones too; `_` names are bases)."""
    return {metric_of(f"m.{node.name}.track()") for path in ASV.glob("*.py") for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_")}


def uncovered(metrics: dict[str, Metric]) -> list[str]:
    """Metrics that gate on CUDA with neither an asv benchmark nor a stated reason; or with both."""
    tracked = asv_metrics()
    return [m.name for m in metrics.values() if m.gates("cuda") and (m.name in tracked) == bool(m.no_asv)]


def test_every_metric_that_gates_on_cuda_has_an_asv_benchmark_or_says_why():
    assert {"cast_us", "attn_us", "step_device_ms", "tpot_ms", "peak_bytes"} <= asv_metrics()
    assert uncovered(METRICS) == []


def test_a_gating_metric_without_either_is_found():  # the negative control of the check above
    planted = dataclasses.replace(METRICS["attn_us"], name="merge_us")
    assert uncovered({**METRICS, "merge_us": planted}) == ["merge_us"]
    reasoned = dataclasses.replace(METRICS["attn_us"], no_asv="a reason beside a benchmark")
    assert uncovered({**METRICS, "attn_us": reasoned}) == ["attn_us"]


def test_the_sglang_gates_benchmarks_follow_a_new_metric_class(monkeypatch):
    """A metric's asv class is written once, in suites/asv/benchmarks.py: ci/asv_sglang_bench/benchmarks.py derives
    its own (same name, the gate's shared setup_cache) from that module, so adding a metric does not touch it."""
    import importlib.util

    from suites.asv import benchmarks

    planted = type("MergeUs", (benchmarks._Timed,), {"__module__": benchmarks.__name__, "metric": "merge_us"})
    monkeypatch.setattr(benchmarks, "MergeUs", planted, raising=False)
    spec = importlib.util.spec_from_file_location("_fresh_sglang_bench", ASV.parent.parent / "ci" / "asv_sglang_bench" / "benchmarks.py")
    sglang_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sglang_bench)
    assert issubclass(sglang_bench.MergeUs, planted) and sglang_bench.MergeUs.setup_cache is sglang_bench._measure_and_check
