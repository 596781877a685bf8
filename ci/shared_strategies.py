"""The benchmarked strategies a base checkout and this one both have, in this one's order, comma-separated:
the MLA_ASV_STRATEGIES of a perf gate whose head adds, removes or reorders a strategy. asv discovers the
parameters once and runs each commit's benchmark by parameter index, so lists that differ between the two
commits would pair the base's results of one strategy with the head's of another.

A strategy the base times and the head does not (removed, or registered with benchmark=False) would go unjudged:
exit 2 naming it, unless --allow-dropped names it (a deliberate removal).

With --presets: the perf gate's MLA_ASV_PRESETS, every preset either checkout declares (the base's order, then the
head's new ones), less those --allow-dropped names. On a GPU the benchmarks otherwise time both commits on the head's
list, so a head that drops a preset was never timed on it, nor was its base; given the base's too, the head's n/a there
fails the gate (ci.asv_gate: lost).

usage: python -m ci.shared_strategies BASE_CHECKOUT [--presets] [--allow-dropped NAME[,NAME...]]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# suites/asv/benchmarks.py's own default list, read in a process that imports the given checkout's harness
# and whether that harness declares which strategies are benchmarked (one from before `register(benchmark=)` times all)
LIST = ("import sys; sys.path.insert(0, 'suites/asv'); from benchmarks import benchmarked; from harness import strategies as s; "
        "print(','.join(benchmarked())); print(int(hasattr(s, 'BENCHMARKED') or any(hasattr(c, 'benchmark') for c in s.REGISTRY.values())))")


PRESETS = "from harness.spec.presets import PRESETS; print(','.join(PRESETS))"


def presets(checkout: Path) -> list[str]:
    """The model presets `checkout`'s harness declares."""
    return _ask(checkout, PRESETS, "presets").split(",")


def benchmarked(checkout: Path) -> list[str]:
    """The strategies the asv benchmarks time by default with `checkout`'s harness (this checkout's benchmark files)."""
    return listing(checkout)[0]


def listing(checkout: Path) -> tuple[list[str], bool]:
    """`benchmarked(checkout)`, and whether that harness declares the list (else every strategy is timed by default)."""
    names, declared = _ask(checkout, LIST.replace("suites/asv", str(ROOT / "suites" / "asv")), "strategies").splitlines()
    return names.split(","), declared == "1"


def _ask(checkout: Path, code: str, what: str) -> str:
    """What `code` prints in a process that imports `checkout`'s harness."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=checkout, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(checkout)},
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"shared-strategies: {checkout}: the harness there does not list its {what} ({tail[0]})")
    return proc.stdout.strip()


def unjudged_drops(base: list[str], head: list[str], allowed: set[str], base_declared: bool = True) -> str | None:
    """Why the gate cannot run: strategies the base times that the head does not and `allowed` does not name; None if
    none, and None for a base that declares no list (it timed every strategy, also those no one meant to benchmark)."""
    if not base_declared:
        return None
    if dropped := [s for s in base if s not in head and s not in allowed]:
        return (f"HEAD no longer benchmarks {','.join(dropped)}, which BASE does: a slowdown there would go unjudged "
                f"(--allow-dropped {','.join(dropped)} gates the rest when the removal is deliberate)")
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    allowed: set[str] = set()
    want_presets = "--presets" in args
    args = [a for a in args if a != "--presets"]
    if len(args) == 3 and args[1] == "--allow-dropped":
        args, allowed = args[:1], set(args[2].split(","))
    if len(args) != 1 or not Path(args[0], "harness").is_dir():
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    if want_presets:
        print(",".join(n for n in dict.fromkeys([*presets(Path(args[0]).resolve()), *presets(ROOT)]) if n not in allowed))
        return 0
    (base, declared), head = listing(Path(args[0]).resolve()), benchmarked(ROOT)
    if why := unjudged_drops(base, head, allowed, declared):
        print(f"shared-strategies: {why}", file=sys.stderr)
        return 2
    shared = [s for s in head if s in base]
    if not shared:
        print(f"shared-strategies: no benchmarked strategy in both {args[0]} and {ROOT}", file=sys.stderr)
        return 2
    print(",".join(shared))
    return 0


if __name__ == "__main__":
    sys.exit(main())
