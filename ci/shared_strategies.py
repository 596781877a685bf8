"""The benchmarked strategies a base checkout and this one both have, in this one's order, comma-separated:
the MLA_ASV_STRATEGIES of a perf gate whose head adds, removes or reorders a strategy. asv discovers the
parameters once and runs each commit's benchmark by parameter index, so lists that differ between the two
commits would pair the base's results of one strategy with the head's of another.

A strategy the base times and the head does not (removed, or registered with benchmark=False) would go unjudged:
exit 2 naming it, unless --allow-dropped names it (a deliberate removal).

usage: python -m ci.shared_strategies BASE_CHECKOUT [--allow-dropped NAME[,NAME...]]
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


def benchmarked(checkout: Path) -> list[str]:
    """The strategies the asv benchmarks time by default with `checkout`'s harness (this checkout's benchmark files)."""
    return listing(checkout)[0]


def listing(checkout: Path) -> tuple[list[str], bool]:
    """`benchmarked(checkout)`, and whether that harness declares the list (else every strategy is timed by default)."""
    proc = subprocess.run([sys.executable, "-c", LIST.replace("suites/asv", str(ROOT / "suites" / "asv"))],
                          cwd=checkout, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(checkout)}, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"shared-strategies: {checkout}: the harness there does not list its strategies ({tail[0]})")
    names, declared = proc.stdout.strip().splitlines()
    return names.split(","), declared == "1"


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
    if len(args) == 3 and args[1] == "--allow-dropped":
        args, allowed = args[:1], set(args[2].split(","))
    if len(args) != 1 or not Path(args[0], "harness").is_dir():
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
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
