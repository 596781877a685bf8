"""Shared test plumbing: run strategies on a golden case exactly as `harness run` does (no timing);
run a test file again in a Triton-interpreter child process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from rich.console import Console

from harness.api import RunConfig, run
from harness.inputs.cases import load_case


def run_strategies(case_name: str, strategies, device="cpu", backend="torch", faults=frozenset(), kernel="auto"):
    """{strategy: (outputs, verdict)} of the strategies that ran; the baseline (stock) always runs as the bitwise anchor."""
    cfg = RunConfig(case=load_case(case_name), device=torch.device(device), backend=backend, kernel=kernel,
                    strategies=tuple(strategies), faults=frozenset(faults), repeats=0,
                    obtained=False)  # an expected red verdict leaves nothing in the committed golden folder
    return {r.strategy: (r.outputs, r.verdict) for r in run(cfg, Console(quiet=True)).results if r.outputs is not None}


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # this process is an interpreter child


def run_under_interpreter(test_file: str, *pytest_args: str) -> subprocess.CompletedProcess:
    """pytest on `test_file` in a fresh process with TRITON_INTERPRET=1 (Triton kernels on the CPU)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args, test_file],
        cwd=Path(__file__).resolve().parents[1], env={**os.environ, "TRITON_INTERPRET": "1", "MLA_HARNESS_INTERPRETER_CHILD": "1"},
        capture_output=True, text=True, timeout=600)
