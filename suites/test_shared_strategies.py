"""ci/shared_strategies.py: the perf gate's MLA_ASV_STRATEGIES when a head adds, removes or reorders a benchmarked
strategy (asv pairs each commit's parameters by index, so differing lists would mislabel results)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from suites.hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parent.parent


def _shared(base: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ci.shared_strategies", str(base), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=HANG_GUARD_S)


def _base(tmp_path: Path, benchmarked: tuple[str, ...]) -> Path:
    (tmp_path / "harness" / "strategies").mkdir(parents=True)
    (tmp_path / "harness" / "__init__.py").write_text("")
    (tmp_path / "harness" / "strategies" / "__init__.py").write_text(f"BENCHMARKED = {benchmarked!r}\n")
    return tmp_path


def test_the_list_is_the_strategies_both_commits_time_in_the_heads_order(tmp_path):
    # a base that times fused_fp8 before stock, lacks gather_cast and still has a strategy retired on purpose
    proc = _shared(_base(tmp_path, ("fused_fp8", "stock", "retired")), "--allow-dropped", "retired")
    assert proc.returncode == 0 and proc.stdout.strip() == "stock,fused_fp8", proc.stderr


def test_a_strategy_the_base_times_and_the_head_does_not_is_refused_unless_allowed(tmp_path):
    """It was left out of the list in silence: a head that stopped benchmarking a strategy was never timed on it."""
    proc = _shared(_base(tmp_path, ("fused_fp8", "stock", "retired")))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("shared-strategies: HEAD no longer benchmarks retired, which BASE does: a slowdown there "
                                   "would go unjudged (--allow-dropped retired gates the rest when the removal is deliberate)")


def test_the_same_checkout_shares_every_strategy():  # the twin: nothing is left out when nothing changed
    from harness.strategies import BENCHMARKED

    proc = _shared(ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == ",".join(BENCHMARKED)


def test_a_folder_without_a_harness_is_refused(tmp_path):
    proc = _shared(tmp_path)
    assert proc.returncode == 2 and "usage" in proc.stderr and proc.stdout == ""


def test_a_base_from_before_the_declared_list_is_not_refused(tmp_path):
    """A harness from before `register(benchmark=)` times every strategy by default, stock_vectorized too (never meant to
    be benchmarked): against it the drop check cried wolf. Twin: a base declaring that list is refused (above)."""
    (tmp_path / "harness" / "strategies").mkdir(parents=True)
    (tmp_path / "harness" / "__init__.py").write_text("")
    (tmp_path / "harness" / "strategies" / "__init__.py").write_text(
        'ORDER = ("stock", "stock_vectorized", "retired")\nREGISTRY = {n: type(n, (), {}) for n in ORDER}\n')
    proc = _shared(tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "stock", proc.stderr


def _with_presets(base: Path, names: tuple[str, ...]) -> Path:
    (base / "harness" / "spec").mkdir(parents=True)
    (base / "harness" / "spec" / "__init__.py").write_text("")
    (base / "harness" / "spec" / "presets.py").write_text(f"PRESETS = dict.fromkeys({names!r})\n")
    return base


def test_the_presets_are_both_commits_so_a_preset_the_head_drops_is_timed_at_the_base(tmp_path):
    """On a GPU both commits were timed on the head's presets: a head without deepseek-v3-tp8 timed neither commit on
    it and the gate passed. Now the list holds the base's too (the head's n/a there fails the gate), less the allowed
    drops; twin: the same checkout lists its own presets once."""
    from harness.spec.presets import PRESETS

    base = _with_presets(_base(tmp_path, ("stock",)), ("retired-tp8", *PRESETS))
    proc = _shared(base, "--presets")
    assert proc.returncode == 0 and proc.stdout.strip() == ",".join(["retired-tp8", *PRESETS]), proc.stderr
    proc = _shared(base, "--presets", "--allow-dropped", "retired-tp8")
    assert proc.returncode == 0 and proc.stdout.strip() == ",".join(PRESETS), proc.stderr
    assert _shared(ROOT, "--presets").stdout.strip() == ",".join(PRESETS)
