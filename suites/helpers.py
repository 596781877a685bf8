"""Shared test plumbing: run strategies on a golden case exactly as `harness run` does (no timing)."""

from __future__ import annotations

import torch
from rich.console import Console

from harness.cases import load_case
from harness.runner import RunConfig, run


def run_strategies(case_name: str, strategies, device="cpu", backend="torch", faults=frozenset(), kernel="auto"):
    """{strategy: (outputs, verdict)} of the strategies that ran; the baseline (stock) always runs as the bitwise anchor."""
    cfg = RunConfig(case=load_case(case_name), device=torch.device(device), backend=backend, kernel=kernel,
                    strategies=tuple(strategies), faults=frozenset(faults), repeats=0)
    return {r.strategy: (r.outputs, r.verdict) for r in run(cfg, Console(quiet=True)).results if r.outputs is not None}
