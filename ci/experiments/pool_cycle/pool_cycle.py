"""Which strategy run leaves its PreparedCase (its pool) alive after `harness run` returns, kept only by a reference
cycle (GPU with FlashInfer and SGLang; docs/evidence/suite/pool-cycle-probe-h100.txt):

  python -m ci.experiments.pool_cycle [CASE]

With automatic collection off, each strategy runs once; a PreparedCase still alive afterwards is printed with the
types in the garbage a full collection then finds (the cycle that held it)."""

from __future__ import annotations

import collections
import gc
import weakref

import torch

from harness.execute import prepared
from suites.helpers import run_strategies

STRATEGIES = ("stock", "stock_vectorized", "gather_cast", "shadow", "native_fp8", "fused_fp8", "sglang_flashinfer")


def garbage_types() -> list[tuple[str, int]]:
    """The commonest types (callables by qualified name) among what a full collection finds unreachable."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    gc.set_debug(0)
    counts = collections.Counter(type(o).__qualname__ + (":" + o.__qualname__ if callable(o) and hasattr(o, "__qualname__") else "")
                                 for o in gc.garbage)
    gc.garbage.clear()
    return counts.most_common(40)


def main(case: str) -> None:
    built: list[weakref.ref] = []
    build = prepared.PreparedCase.build

    def tracked(self, *args, **kwargs):
        build(self, *args, **kwargs)
        built.append(weakref.ref(self))

    prepared.PreparedCase.build = tracked
    gc.collect()
    gc.disable()
    for strategy in STRATEGIES:
        built.clear()
        try:
            run_strategies(case, [strategy], device="cuda", backend="flashinfer", kernel="fa3")
        except Exception as error:
            print(strategy, "error", error)
            continue
        alive = bool(built) and built[0]() is not None
        print(f"{strategy}: prep alive after return = {alive}, allocated {torch.cuda.memory_allocated() / 2**20:.0f} MiB", flush=True)
        if alive:
            print("  garbage:", garbage_types(), flush=True)
        gc.collect()
        print(f"  after gc: allocated {torch.cuda.memory_allocated() / 2**20:.0f} MiB", flush=True)
