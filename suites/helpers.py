"""Shared test plumbing: run strategies on a case and check them like `harness run` does."""

from __future__ import annotations

import torch

from harness import golden
from harness.backends import make_backend
from harness.cases import load_case
from harness.check import Verdict
from harness.decode import DecodeSession, make_step_data
from harness.faults import FAULT_TARGET
from harness.pool import KVPool, PoolGeometry
from harness.runner import _verdict
from harness.strategies import REGISTRY


def run_strategies(case_name: str, strategies, device="cpu", backend="torch", faults=frozenset()):
    """{strategy: (outputs, verdict)} for a golden case; stock runs first as the bitwise anchor."""
    case = load_case(case_name)
    device = torch.device(device)
    gold = golden.load(case_name)
    be = make_backend(backend, device)
    schedule = case.schedule()
    pool = KVPool(PoolGeometry(case.scale.slots, case.num_layers, case.preset.row_width), case.scenario.seed, device)
    data = make_step_data(case.preset, schedule, pool, faults)
    results: dict[str, tuple[dict, Verdict]] = {}
    stock = None
    for name in ("stock", *[s for s in strategies if s != "stock"]):
        own = frozenset(f for f in faults if FAULT_TARGET[f] in (None, name))
        with DecodeSession(REGISTRY[name](pool, be, case.preset, own), schedule, data) as session:
            outputs = session.run_all(case.checked_layers())
        verdict = _verdict(name, be.name, outputs, gold, None if name == "stock" else stock, REGISTRY[name].tier)
        if name == "stock":
            stock = outputs
        results[name] = (outputs, verdict)
    return results
