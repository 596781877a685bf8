"""Which strategy run leaves its PreparedCase (its pool) alive after `harness run` returns, kept only by a reference
cycle: python ci/experiments/pool_cycle/probe.py [CASE] on a GPU with FlashInfer and SGLang (docs/evidence/suite/pool-cycle-probe-h100.txt)."""
import collections, gc, sys, weakref, torch
from harness.execute import prepared
from suites.helpers import run_strategies
refs = []
orig = prepared.PreparedCase.build
def build(self, *a, **k):
    orig(self, *a, **k)
    refs.append(weakref.ref(self))
prepared.PreparedCase.build = build
gc.collect(); gc.disable()
case = sys.argv[1] if len(sys.argv) > 1 else "glm5-tp8.ci.b1-l500"
for strat in ["stock", "stock_vectorized", "gather_cast", "shadow", "native_fp8", "fused_fp8", "sglang_flashinfer"]:
    refs.clear()
    for kernel in ("fa3",):
        try:
            r = run_strategies(case, [strat], device="cuda", backend="flashinfer", kernel=kernel)
        except Exception as e:
            print(strat, "error", e); continue
        del r
    alive = refs[0]() is not None if refs else None
    print(f"{strat}: prep alive after return = {alive}, allocated {torch.cuda.memory_allocated()/2**20:.0f} MiB", flush=True)
    if alive:
        gc.set_debug(gc.DEBUG_SAVEALL); gc.collect(); gc.set_debug(0)
        c = collections.Counter()
        for o in gc.garbage:
            name = type(o).__qualname__
            if callable(o) and hasattr(o, "__qualname__"):
                name += ":" + getattr(o, "__qualname__", "")
            c[name] += 1
        print("  garbage:", c.most_common(40), flush=True)
        gc.garbage.clear()
    gc.collect()
    print(f"  after gc: allocated {torch.cuda.memory_allocated()/2**20:.0f} MiB", flush=True)
