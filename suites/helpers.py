"""Shared test plumbing: run strategies on a golden case exactly as `harness run` does (no timing);
run a test file again in a Triton-interpreter child process; read a results file's repro command; a results
document as another run would write it; a fresh copy of an asv benchmark file; a CPU run's files as a GPU box's, its
clocks dropping in every timing block."""

from __future__ import annotations

import copy
import importlib.util
import itertools
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

from harness import CHECKOUT, envvars
from harness.api import RunConfig, run
from harness.backends import make_backend
from harness.errors import HarnessError
from harness.inputs.cases import load_case
from harness.results.metrics import METRICS
from harness.results.schema import sample_iqr
from suites.hang_guard import HANG_GUARD_S


def run_strategies(case_name: str, strategies, device="cpu", backend="torch", faults=frozenset(), kernel="auto",
                   require: bool = False):
    """{strategy: (outputs, verdict)} of the strategies that ran; the baseline (stock) always runs: every strategy is checked against it.
    `require`: a requested strategy that produced no outputs (an error or unsupported verdict) fails the caller with
    its verdict, instead of going missing from the result."""
    cfg = RunConfig(case=load_case(case_name), device=torch.device(device), backend=backend, kernel=kernel,
                    strategies=tuple(strategies), faults=frozenset(faults), repeats=0,
                    obtained=False)  # an expected red verdict leaves nothing in the committed golden folder
    results = run(cfg, Console(quiet=True)).results
    missing = [f"{r.strategy} did not run ({r.verdict.status.value}: {r.verdict.reason})" for r in results
               if r.outputs is None and r.strategy in strategies]
    assert not (require and missing), "; ".join(missing)
    return {r.strategy: (r.outputs, r.verdict) for r in results if r.outputs is not None}


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # this process is an interpreter child


def flashinfer_or_skip(device, kernel: str = "auto"):
    """The FlashInfer backend of `kernel` on this GPU; a kernel its arch policy does not list (fa3 off SM90, any on an
    arch the policy does not name) skips the test with the policy's line instead of erroring."""
    try:
        return make_backend("flashinfer", device, kernel)
    except HarnessError as exc:
        pytest.skip(str(exc))


def run_under_interpreter(test_file: str, *pytest_args: str) -> subprocess.CompletedProcess:
    """pytest on `test_file` in a fresh process with TRITON_INTERPRET=1 (Triton kernels on the CPU)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args, test_file],
        cwd=Path(__file__).resolve().parents[1], env={**os.environ, "TRITON_INTERPRET": "1", "MLA_HARNESS_INTERPRETER_CHILD": "1"},
        capture_output=True, text=True, timeout=600)



def assert_replay_equals_eager(prep, strategy: str) -> None:
    """Every step of `prep`'s schedule replayed through its bucket graph equals the eager step bit for bit (outputs
    and LSE of each layer; padded lanes cut off)."""
    layers = set(range(prep.geometry.num_layers))
    with prep.session(strategy) as session:
        eager = {}
        for batch in prep.schedule.steps:
            eager.update(session.step(batch, layers))
    with prep.session(strategy) as session:
        for batch in prep.schedule.steps:
            graph = session.bucket_graph(batch, layers)
            graph.load(batch)
            for key, (out, lse) in graph.replay().items():
                n = batch.batch_size
                assert torch.equal(out[:n].view(torch.int16), eager[key][0].view(torch.int16)), (strategy, key)
                assert torch.equal(lse[:n], eager[key][1]), (strategy, key)


def shrunk_step_case():
    """A bucket replayed for a step smaller than its first: deepseek-v3-tp8 CI pool, 4 requests, request 3 finished
    after step 0 and its slot reused at step 2, so padding lanes that rewrote the first step's rows would
    overwrite another request's new token (they must write row 0 only)."""
    import dataclasses

    from harness.execute.prepared import PreparedCase
    from harness.spec.scenario import Finish

    case = load_case("deepseek-v3-tp8.ci.b1-l500")
    scenario = dataclasses.replace(case.scenario, name="stale-lane", steps=3, kv_lens=(4, 4, 4, 4),
                                   finish=(Finish(after_step=0, request=3),))
    prep = PreparedCase(dataclasses.replace(case, scenario=scenario), torch.device("cpu")).build()
    assert int(prep.schedule.steps[0].write_slots[3]) in prep.schedule.steps[2].write_slots  # lane 3's old slot reused
    return prep


def repro_words(repro: str) -> tuple[list[str], list[str]]:
    """A recorded repro's variables (VAR=value, PYTHONPATH last, the checkout first in it; a leading `env -u VAR ...`
    left out) and the harness's arguments, after this interpreter's `-P -m harness`."""
    words = shlex.split(repro)
    i = words.index(sys.executable)
    assert words[i - 1].startswith(f"PYTHONPATH={CHECKOUT}") and words[i + 1:i + 4] == ["-P", "-m", "harness"], repro
    assigned = [w for w in words[:i] if "=" in w]
    return assigned, words[i + 4:]


def nudged(doc: dict, ulps: int = 1) -> dict:
    """A results document with the slowest sample of its first timing of three samples or more `ulps` ulps slower
    (its median stays), else its first timing's value and sample: two runs never draw the same timings, and `compare`
    refuses a file whose timings are all the base's (one run relabelled). A document without a timing is returned as
    it is."""
    rows = copy.deepcopy(doc["rows"])
    timed = [r for r in rows if (m := METRICS.get(r.get("metric"))) and m.timed and isinstance(r.get("value"), float)]
    row = next((r for r in timed if len(r.get("samples") or []) >= 3), timed[0] if timed else None)
    if row is not None:
        for _ in range(ulps):
            if samples := row.get("samples"):
                i = max(range(len(samples)), key=samples.__getitem__)
                samples[i] = math.nextafter(samples[i], math.inf)
                row["value"] = row["value"] if len(samples) >= 3 else statistics.median(samples)
            else:
                row["value"] = math.nextafter(row["value"], math.inf)
    return {**doc, "rows": rows}


def set_samples(row: dict, samples: list[float]) -> None:
    """A results row's timing samples edited as a writer would record them: the value is their median, the iqr theirs."""
    row.update(samples=samples, value=statistics.median(samples), iqr=sample_iqr(samples))


def another_run(doc: dict) -> dict:
    """A results document as another run of the same rows would write it: another `created` stamp, `nudged`."""
    return {**nudged(doc), "created": "2026-12-03T00:00:00+00:00"}


def interrupt_when_marked(proc: subprocess.Popen, mark: Path, how: str | None) -> tuple[str, str]:
    """Once `mark` exists (the child is under way), interrupt `proc`, started in a session of its own, as a cancelled
    job would ("sigterm": SIGTERM to it; "ctrl-c": SIGINT to its process group; None: let it finish); its output."""
    deadline = time.monotonic() + HANG_GUARD_S
    while how and not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    elif how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    return proc.communicate(timeout=HANG_GUARD_S)


def fresh_asv_module(name: str, monkeypatch, env: dict[str, str], without_envvars: bool = False):
    """A fresh copy of suites/asv/<name>.py as asv imports it under `env`; without_envvars: as on a
    base commit whose harness has no harness/envvars.py."""
    for var in envvars.VARIABLES:
        monkeypatch.delenv(var.name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if without_envvars:
        import harness

        monkeypatch.setitem(sys.modules, "harness.envvars", None)  # the import fails as on a base commit
        monkeypatch.delattr(harness, "envvars", raising=False)
    monkeypatch.delitem(sys.modules, "suites.asv.benchmarks", raising=False)  # bench_tpot's `.benchmarks`: fresh too, as in asv's process
    spec = importlib.util.spec_from_file_location(f"suites.asv._fresh_{name}", CHECKOUT / "suites" / "asv" / f"{name}.py")  # in the package: bench_tpot imports .benchmarks
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GPU_BOX = {"gpu": "NVIDIA H200", "capability": "9.0", "torch": "2.11.0", "git_commit": "abc", "hostname": "ci", "device": "cuda:0"}


def as_on_a_gpu_box(monkeypatch) -> None:
    """A CPU run's results written as on one GPU box (its environment: timings gate) with a steady control copy, so
    that two such files compare on their rows alone (a CPU's copy noise would set their environments apart)."""
    import harness.measure.environment
    from harness.measure import control
    from harness.measure.timing import Samples

    monkeypatch.setattr(harness.measure.environment, "environment", lambda device: dict(GPU_BOX))
    monkeypatch.setattr(control, "measure_control", lambda device, repeats=control.REPEATS: Samples("GB/s", tuple(4000.0 + i for i in range(repeats))))


def clocks_drop_in_every_block(monkeypatch) -> None:
    """Every timing block (collect.guarded, their single call point) under the real clock guard of a GPU whose SM clock
    drops while it runs: the guard runs it again, then marks it disturbed."""
    from harness.measure import clocks, collect

    readings = itertools.cycle((clocks.GpuState(1980, 2619, 40, (), 1), clocks.GpuState(1200, 2619, 40, (), 1)))  # before, after
    monkeypatch.setattr(collect, "guarded", lambda block, device: clocks.guarded(block, torch.device("cuda", 0), read=lambda _: next(readings)))
