"""Behaviours no other test pinned (issue 25, "Behaviours no test pins"): each test here fails when
its behaviour is broken; suites/test_mutations_pins.py plants each fault and checks that it does."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.backends.contract import ContractViolation, check_boundary
from harness.execute.prepared import PreparedCase
from harness.inputs.cases import load_case
from harness.strategies import REGISTRY
from harness.verify import check, golden
from suites.hang_guard import HANG_GUARD_S
from suites.helpers import INTERPRETED, run_under_interpreter

ROOT = Path(__file__).resolve().parent.parent
MULTISTEP = "glm5-tp8.ci.multistep-reuse"


# --- the golden coverage check: every step, step 0 included --------------------------------------

def _gold_edited(edit) -> golden.GoldenData:
    gold = golden.load(MULTISTEP)
    tensors, manifest = dict(gold.tensors), {**gold.manifest}
    edit(tensors, manifest)
    return golden.GoldenData(tensors, manifest)


def test_coverage_covers_every_step_and_step_0():
    case = load_case(MULTISTEP)
    steps = [b.step for b in case.schedule().steps]
    assert steps[0] == 0 and len(steps) > 2
    assert golden.coverage_gap(golden.load(MULTISTEP), case) == ""
    for step in (0, steps[-1]):
        def drop(t, m, step=step):
            m["checked"] = [k for k in m["checked"] if k[0] != step]
        assert golden.coverage_gap(_gold_edited(drop), case).startswith("checked"), step

        def shift(t, m, step=step):
            t[f"s{step}.positions"] = t[f"s{step}.positions"].flip(0) + 1
        assert golden.coverage_gap(_gold_edited(shift), case) == f"s{step}.positions differ from the schedule's", step

    def other_requests(t, m):
        m["checked_request_ids"] = m["checked_request_ids"][:-1]
    assert golden.coverage_gap(_gold_edited(other_requests), case) == "checked_request_ids differ from the case's"


# --- the dtype contract flags ckv and kpe each on its own ----------------------------------------

def _boundary(ckv=torch.bfloat16, kpe=torch.bfloat16):
    q = torch.zeros(2, 8, 512, dtype=torch.bfloat16)
    return q, torch.zeros(10, 1, 512, dtype=ckv), torch.zeros(10, 1, 64, dtype=kpe), torch.zeros(2, 8, 512, dtype=torch.bfloat16), torch.zeros(2, 8)


@pytest.mark.parametrize(("ckv", "kpe"), [(torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16),
                                          (torch.float8_e4m3fn, torch.bfloat16), (torch.bfloat16, torch.float8_e4m3fn)])
def test_contract_flags_ckv_and_kpe_each_alone(ckv, kpe):
    check_boundary("s", torch.bfloat16, *_boundary())
    with pytest.raises(ContractViolation, match=f"KV handed to the backend is {ckv}/{kpe}, not torch.bfloat16"):
        check_boundary("s", torch.bfloat16, *_boundary(ckv, kpe))


# --- the tolerance lookup: the exact backend key first, then its family, never a suffix -----------

def test_tolerance_lookup_by_exact_backend_key(monkeypatch):
    tol = {k: check.Tolerance(atol=i, rtol=0.0, max_norm_rel=0.0, lse_atol=0.0)
           for i, k in enumerate(["default", "stock", "stock.flashinfer", "stock.flashinfer-fa3", "gather_cast.torch"])}
    monkeypatch.setattr(check, "default_policy", lambda: tol)
    assert check.policy("stock", "flashinfer-fa3") is tol["stock.flashinfer-fa3"]
    assert check.policy("stock", "flashinfer-fa2") is tol["stock.flashinfer"]  # the family row
    assert check.policy("stock", "torch") is tol["stock"]
    assert check.policy("stock", "fa3") is tol["stock"]  # not "stock.flashinfer-fa3" by its suffix
    assert check.policy("gather_cast", "flashinfer-fa3") is tol["default"]
    assert check.policy("gather_cast", "torch") is tol["gather_cast.torch"]
    assert check.policy("shadow", "torch") is tol["default"]


# --- the strategies' byte accounting --------------------------------------------------------------

def _held_bf16_bytes(strategy) -> int:
    """BF16 KV copies the strategy holds (its buffers), plus the per-layer temporary its cast returns."""
    held = [t for v in vars(strategy).values() for t in (v if isinstance(v, list) else [v]) if isinstance(t, torch.Tensor)]
    total = sum(t.nbytes for t in held if t.dtype == torch.bfloat16)
    fn, args = strategy.cast_call(0)
    out = fn(*args)
    pool = {b.data_ptr() for b in strategy.pool.buffers}
    if out.dtype == torch.bfloat16 and all(out.data_ptr() != t.data_ptr() for t in held) and out.data_ptr() not in pool:
        total += out.nbytes  # a fresh tensor per layer (stock's cast): one at a time
    return total


@pytest.mark.parametrize("case_name", ["glm5-tp8.ci.b1-l500", MULTISTEP, "deepseek-v3-tp8.ci.b1-l500"])
def test_extra_bytes_is_what_each_strategy_allocates(case_name):
    """extra_bytes (the memory plan and the results' row) equals the BF16 buffers the strategy really
    holds on the CPU; a strategy with no copy declares 0."""
    prep = PreparedCase(load_case(case_name), torch.device("cpu"))
    prep.build()
    seen = {}
    for name, cls in REGISTRY.items():
        if prep.unsupported_reason(name):
            continue
        with prep.session(name) as session:
            session.strategy.step_indices(prep.schedule.steps[0])
            seen[name] = (cls.extra_bytes(prep.geometry, prep.schedule), _held_bf16_bytes(session.strategy))
    assert {"stock", "gather_cast", "shadow"} <= set(seen)
    assert all(declared == held for declared, held in seen.values()), seen
    assert seen["stock"][0] == prep.geometry.layer_bytes * 2 and seen["shadow"][0] == prep.geometry.kv_bytes * 2


# --- the test infrastructure's own guards --------------------------------------------------------

STRICT_TESTS = '''
import pytest

def test_ok():
    pass

def test_plain_skip():
    pytest.skip("skipped for no reason a GPU explains")
'''


def _pytest_in_copy(tmp_path: Path, tests: str, strict: str | None) -> subprocess.CompletedProcess:
    """pytest on `tests` in a copy of this checkout's pytest setup (conftest.py, plugins, harness)."""
    for name in ("conftest.py", "pyproject.toml", "harness", "suites/__init__.py", "suites/plugins", "suites/helpers.py"):
        src, dest = ROOT / name, tmp_path / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__")) if src.is_dir() else shutil.copy2(src, dest))
    (tmp_path / "suites" / "test_planted.py").write_text(tests)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLA_HARNESS_", "PYTEST_", "TRITON_"))}
    if strict is not None:
        env["MLA_HARNESS_STRICT_SKIPS"] = strict
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "suites/test_planted.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)


def test_strict_skip_guard_fails_a_session_with_an_unexplained_skip(tmp_path):
    """MLA_HARNESS_STRICT_SKIPS=1 (.ci/run) turns a skip no marker explains into a failed session;
    unset, the same session passes; a gpu-marked skip is allowed."""
    strict = _pytest_in_copy(tmp_path / "strict", STRICT_TESTS, "1")
    assert strict.returncode == 1, strict.stdout[-3000:] + strict.stderr[-2000:]
    assert "1 test(s) skipped here and run nowhere else" in strict.stdout and "test_plain_skip" in strict.stdout
    lax = _pytest_in_copy(tmp_path / "lax", STRICT_TESTS, None)
    assert lax.returncode == 0, lax.stdout[-3000:]
    gpu = _pytest_in_copy(tmp_path / "gpu", "import pytest\n\n@pytest.mark.gpu\ndef test_g():\n    pytest.skip('no GPU')\n", "1")
    assert gpu.returncode == 0, gpu.stdout[-3000:]


@pytest.mark.skipif(INTERPRETED, reason="this is the TRITON_INTERPRET=1 child run")
def test_triton_shim_is_installed_in_the_interpreter_child():
    pytest.importorskip("triton", reason="triton is not installed")
    proc = run_under_interpreter(__file__, "-k", "shim_is_live")
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]


@pytest.mark.skipif(not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 child of test_triton_shim_is_installed_in_the_interpreter_child")
def test_shim_is_live():
    from triton.runtime import interpreter as ti

    from suites.plugins import triton_interpreter

    assert triton_interpreter._state["installed"]
    assert ti._patch_lang.__qualname__.startswith("install.") and ti.GridExecutor.__call__.__qualname__.startswith("install.")


# --- the kernels' launch helpers refuse what would write out of bounds ----------------------------

def test_kernel_launchers_validate_before_launching():
    pytest.importorskip("triton", reason="triton is not installed")
    from harness.kernels import gather_cast, shadow_write
    from harness.kernels.rowtile import check_index, rows_2d, split_width

    pool = torch.zeros(16, 1, 576, dtype=torch.uint8)
    with pytest.raises(ValueError, match="bad shapes"):  # 10 rows into a 5-row buffer
        gather_cast.gather_cast_(pool, torch.arange(10), torch.zeros(5, 1, 576, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bad shapes"):
        gather_cast.gather_cast_(pool, torch.arange(3), torch.zeros(5, 1, 512, dtype=torch.bfloat16))
    for bad in (torch.arange(4).float(), torch.arange(8)[::2], torch.zeros(2, 2, dtype=torch.int64)):
        with pytest.raises(ValueError, match="indices must be"):
            check_index(bad)
    with pytest.raises(ValueError, match="contiguous"):
        rows_2d(torch.zeros(4, 8, 2)[:, :, 0])
    assert [split_width(w) for w in (576, 70, 2)] == [(512, 64, 64), (64, 6, 8), (1, 1, 1)]
    with pytest.raises(ValueError):
        shadow_write.write_fp8_and_bf16_(pool, torch.zeros(16, 1, 576, dtype=torch.bfloat16), torch.arange(3),
                                         torch.zeros(4, 576, dtype=torch.uint8))  # 3 slots, 4 rows of codes


# --- the asv benchmarks: the sample clock and the units handed to asv -----------------------------

def _benchmarks(monkeypatch):
    monkeypatch.setenv("MLA_ASV_SCENARIOS", "b1-l500")
    monkeypatch.setenv("MLA_ASV_STRATEGIES", "gather_cast")
    monkeypatch.setenv("MLA_ASV_REPEATS", "3")
    monkeypatch.setenv("MLA_ASV_PRESETS", "glm5-tp8")
    spec = importlib.util.spec_from_file_location("_pins_asv_benchmarks", ROOT / "suites" / "asv" / "benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_asv_sample_clock_hands_each_sample_once(monkeypatch):
    bench = _benchmarks(monkeypatch)
    clock = bench._SampleClock()
    clock.load("k", [0.5, 0.25, 2.0])
    times = []
    for _ in range(3):
        start = clock()
        clock.tick()
        times.append(clock() - start)
        clock.load("k", [9.0])  # asv re-runs setup before each sample: the position is kept
    assert times == [0.5, 0.25, 2.0]
    with pytest.raises(RuntimeError, match="sample 4 of 3"):
        clock.tick()
    clock.load("other", [1.0])
    clock.tick()
    assert clock() == 3.75


def test_asv_benchmarks_report_seconds_for_every_timed_metric(monkeypatch):
    """Each timed class names a declared metric whose unit converts to seconds exactly; asv takes
    the REPEATS samples once (rounds 1, no warm-up)."""
    from harness.results.metrics import METRICS

    bench = _benchmarks(monkeypatch)
    timed = [c for c in vars(bench).values() if isinstance(c, type) and issubclass(c, bench._Timed) and c is not bench._Timed]
    assert {c.metric for c in timed} == {"cast_us", "attn_us", "step_device_ms", "step_host_ms", "step_ms"}
    for c in timed:
        unit = METRICS[c.metric].unit
        assert bench.TO_SECONDS[unit] == {"us": 1e-6, "ms": 1e-3}[unit], c.metric
        assert (c.number, c.rounds, c.warmup_time, c.repeat[:2]) == (1, 1, 0, (3, 3)), c.__name__
    cache = '{"glm5-tp8": {"b1-l500": {"builds": 1, "strategies": {"gather_cast": {"cast_us": [1e-6, 2e-6]}, "shadow": {"skipped": "why"}}}}}'
    assert bench.CastUs()._values(cache, "b1-l500", "gather_cast", "glm5-tp8") == [1e-6, 2e-6]
    for strategy, cls in (("shadow", bench.CastUs), ("gather_cast", bench.AttnUs)):
        with pytest.raises(NotImplementedError):  # asv records a skip (n/a), not a number
            cls()._values(cache, "b1-l500", strategy, "glm5-tp8")



def test_asv_setup_cache_hands_asv_seconds(monkeypatch):
    """_measure_all converts each measured sample to seconds by its unit (asv's timer is in seconds),
    keeps a skipped strategy's reason, and builds one pool per scenario."""
    import json
    from collections import Counter

    import harness.measure.collect
    from harness.measure.collect import Measured
    from harness.measure.timing import Samples

    bench = _benchmarks(monkeypatch)
    monkeypatch.setattr(bench, "STRATEGIES", ["gather_cast", "stock_vectorized"])  # the second needs CUDA
    fake = Measured({"cast_us": Samples("us", (2.0, 4.0)), "step_ms": Samples("ms", (1.5,)), "extra": Samples("B", (7.0,))},
                    skipped={"attn_us": "planted"})
    monkeypatch.setattr(harness.measure.collect, "measure", lambda session, repeats: fake if repeats == 3 else None)
    monkeypatch.setattr(PreparedCase, "builds", Counter())  # pools built by this process's other tests
    out = json.loads(bench._measure_all())["glm5-tp8"]["b1-l500"]
    assert out["builds"] == 1
    assert out["strategies"]["gather_cast"] == {"cast_us": pytest.approx([2e-6, 4e-6]), "step_ms": pytest.approx([1.5e-3]),
                                                "disturbed": {}}
    assert "cuda only" in out["strategies"]["stock_vectorized"]["skipped"]


def test_fused_launcher_checks_and_buffers():
    """fused_mla_decode's launch helper: what it refuses before launching, the options that exclude
    each other, and the split buffers' shapes (the CTA merge's arrival counters start at zero)."""
    pytest.importorskip("triton", reason="triton is not installed")
    from harness.kernels.fused_mla_decode import Config, _check, fused_mla_decode, partial_buffers

    def args(**kw):
        a = dict(q_nope=torch.zeros(2, 8, 512, dtype=torch.bfloat16), q_pe=torch.zeros(2, 8, 64, dtype=torch.bfloat16),
                 ckv=torch.zeros(10, 1, 512, dtype=torch.uint8), kpe=torch.zeros(10, 1, 64, dtype=torch.uint8),
                 kv_indptr=torch.tensor([0, 3, 5], dtype=torch.int32), kv_indices=torch.arange(5, dtype=torch.int32))
        return {**a, **kw}

    assert _check(**args()) == (2, 8, 512, 64)
    for bad, error, match in [
        (dict(ckv=torch.zeros(10, 1, 512, dtype=torch.bfloat16)), TypeError, "uint8"),
        (dict(kpe=torch.zeros(10, 1, 64, dtype=torch.float8_e4m3fn)), TypeError, "uint8"),
        (dict(q_pe=torch.zeros(2, 8, 64, dtype=torch.float16)), TypeError, "bfloat16"),
        (dict(kv_indices=torch.arange(5)), ValueError, "kv_indices must be contiguous int32"),
        (dict(kv_indptr=torch.tensor([0, 5], dtype=torch.int32)), ValueError, "bad shapes"),
        (dict(kpe=torch.zeros(9, 1, 64, dtype=torch.uint8)), ValueError, "bad KV shapes"),
        (dict(q_nope=torch.zeros(2, 512, 8, dtype=torch.bfloat16).transpose(1, 2)), ValueError, "q_nope channels"),
    ]:
        with pytest.raises(error, match=match):
            _check(**args(**bad))
    with pytest.raises(ValueError, match="new_tokens must be None or >= 0, got -1"):
        fused_mla_decode(**args(), sm_scale=1.0, config=Config(num_splits=1), new_tokens=-1)
    for bad in (dict(prefetch=True, reload_v=True), dict(dv_split=3), dict(qk_chunk=32), dict(pdl_merge=True),
                dict(tokens_m=True, prefetch=True), dict(contig=True, reload_v=True)):
        with pytest.raises(ValueError):
            Config(num_splits=2, **bad)
    part_out, part_lse, arrivals = partial_buffers(4, 20, Config(num_splits=3), 512, "cpu")
    assert (part_out.shape, part_out.dtype, part_lse.shape, part_lse.dtype) == ((4, 3, 20, 512), torch.float32, (4, 3, 20), torch.float32)
    assert arrivals.shape == (4 * 3,) and arrivals.dtype == torch.int32 and not arrivals.any()  # ceil(20 / 8) = 3 per request
    assert all(t.numel() == 0 for t in partial_buffers(4, 20, Config(num_splits=1), 512, "cpu"))
