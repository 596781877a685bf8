"""`harness golden refresh|verify`: recompute every golden; write new or changed ones, or report them."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from harness.errors import CheckFailed, HarnessError

HELP = "golden files: refresh or verify"


def command(args, console: Console) -> int:
    """Every case is checked: an unreadable one does not stop the others (the exit-2 line names the first)."""
    from harness.inputs.cases import golden_case_names, load_case
    from harness.progress import progress_bar
    from harness.verify import golden

    if args.case is not None and not args.case.strip():
        raise HarnessError("--case", "is empty: name one case '<preset>.<scale>.<scenario>', or leave --case out for all")
    if args.force and args.action == "verify":
        raise HarnessError("--force", "only golden refresh reads it (it overwrites changed goldens); verify writes nothing")
    names = [args.case] if args.case is not None else golden_case_names()
    cases = [load_case(n) for n in names]
    failures, unreadable = [], []
    for case in cases:
        if args.action == "refresh":  # verify only reads: it deletes nothing
            removed, kept = golden.clean_leftovers(case.name)
            for name in removed:
                console.print(f"{case.name}: removed {name}, left by a killed refresh", markup=False, highlight=False)
            if kept:
                console.print(f"{case.name}: left {', '.join(kept)} alone: not marked as a refresh's own, or holding other "
                              "files", markup=False, highlight=False, soft_wrap=True)
        t0 = time.perf_counter()
        n = len(case.checked_layers()) * case.scenario.steps
        if args.action == "verify":
            try:
                stored = golden.load(case.name)
            except HarnessError as exc:
                unreadable.append(_unreadable(console, case.name, exc))
                continue
            with progress_bar(console, f"verify {case.name}", n) as advance:
                fresh = golden.compute(case, progress=advance)
            changes = golden.differences(stored, fresh)
            status = "[green]ok[/]" if not changes else "[bold red]MISMATCH[/]"
        else:
            try:
                golden.refuse_a_link(case.name)  # before the work, and for either path: a forced write, an obtained file
            except HarnessError as exc:
                unreadable.append(_unreadable(console, case.name, exc, "REFUSED"))
                continue
            with progress_bar(console, f"refresh {case.name}", n) as advance:
                fresh = golden.compute(case, progress=advance)
            if not os.path.lexists(golden.case_dir(case.name)):  # a folder without a manifest is no new case
                stored = None
            else:
                try:
                    stored = golden.load(case.name)
                except HarnessError as exc:
                    if not args.force:
                        kept = HarnessError(exc.where, f"{exc.message}; not overwritten (refresh --force replaces it)")
                        unreadable.append(_unreadable(console, case.name, kept))
                        continue
                    stored = exc
            changes = golden.differences(stored, fresh) if isinstance(stored, golden.GoldenData) else []
            if stored is None:
                golden.write(fresh, case.name)
                status = "[green]written[/] (new case)"
            elif isinstance(stored, HarnessError):  # nothing to diff against: say why, not a change of every field
                golden.write(fresh, case.name)
                status = f"[yellow]overwritten (--force)[/] an unreadable golden ({escape(str(stored))})"
            elif not changes:
                status = "[green]unchanged[/]"
            elif args.force:
                golden.write(fresh, case.name)
                status = "[yellow]overwritten (--force)[/]; what changed:"
                for change in changes:
                    status += f"\n  {escape(change)}"
                changes = []
            else:
                status = "[bold red]CHANGED, not written (use --force)[/]"
        console.print(f"{escape(case.name)}: {status} in {time.perf_counter() - t0:.1f}s")
        for change in changes:
            console.print(f"  {change}", markup=False)
        if changes:
            failures.append(case.name)
            console.print(f"  {golden.write_obtained(case.name, Path(golden.OUTPUTS).stem, fresh.tensors)}", markup=False,
                          highlight=False, soft_wrap=True)
    if unreadable:
        first, more = unreadable[0], len(unreadable) - 1
        also = [f"{more} more unreadable"] * bool(more) + [f"{len(failures)} differ"] * bool(failures)
        raise HarnessError(first.where, first.message + (f" (also {' and '.join(also)}: listed above)" if also else ""))
    if failures:
        raise CheckFailed(f"golden {args.action}: {len(failures)} case(s) differ: {', '.join(failures)}")
    return 0


def _unreadable(console: Console, case_name: str, exc: HarnessError, label: str = "UNREADABLE") -> HarnessError:
    console.print(f"{case_name}: {label}: {exc}", markup=False, highlight=False)
    return exc


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("refresh", "verify"))
    p.add_argument("--case", help="one case '<preset>.<scale>.<scenario>' (default: all in golden/cases.toml)")
    p.add_argument("--force", action="store_true", help="refresh: overwrite goldens that changed")
    p.add_argument("--golden-dir", type=Path, help="golden folder (default: $MLA_HARNESS_GOLDEN_DIR, else the checkout's golden/)")
