"""Writing results: one row per (case, strategy, metric) of one case, with an environment fingerprint
(harness.measure.environment) and repro command. The records (Row, Case) are harness/results/schema.py's, which the readers use too."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
from dataclasses import asdict, is_dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import get_args

import numpy as np

from harness import CHECKOUT
from harness.errors import HarnessError
from harness.fsio import write_text
from harness.results.metrics import METRICS, validate_rows
from harness.results.schema import CASE_FIELDS, ROW_CASE_FIELDS, SCHEMA, Case, Command, Row, parse_results

__all__ = ["SCHEMA", "Case", "Row", "case_record", "document", "pin_case", "pin_options", "repro_command", "repro_env", "workload_digest", "write_results"]


PATH_OPTIONS = ("--scenario-file", "--json", "--dump-outputs", "--golden-dir", "--allreduce-table", "--sglang-workdir",
                "--sglang-python", "--out")  # --out: export-inputs' bundle
COMMAND_OPTIONS = ("--sglang-python",)  # a path when it has a "/", else a command the rerun's PATH finds
NOT_REPEATED = ("--force",)  # a rerun never replaces the results it reproduces (it asks for a new --json)
REPRO_ENV = ("MLA_HARNESS_GOLDEN_DIR", "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES")  # set ones change what a run does
PATH_ENV = ("MLA_HARNESS_GOLDEN_DIR",)
# unset ones stay unset in the rerun (`env -u`): a shell that exports them would check against another golden or run
# Triton's interpreter; CUDA_VISIBLE_DEVICES unset is left to the rerunning machine (which GPU is free there)
REPRO_UNSET = ("MLA_HARNESS_GOLDEN_DIR", "TRITON_INTERPRET")


def repro_command(argv: list[str] | None = None) -> str:
    """The command line that reruns this one from any folder: this interpreter (sys.executable) on this checkout's
    harness (PYTHONPATH, before the run's own; -P: no harness/ of the current folder comes first), path options
    made absolute, --force left out, the set variables of REPRO_ENV put before it and the unset ones of REPRO_UNSET
    kept unset (env -u VAR VAR2=value PYTHONPATH=/checkout /venv/bin/python -P -m harness ...)."""
    args, option = [], None  # option: the path option whose value comes next
    for word in sys.argv[1:] if argv is None else argv:
        name, eq, value = word.partition("=")
        if option:
            word, option = _absolute(word, option), None
        elif eq and name in PATH_OPTIONS:
            word = f"{name}={_absolute(value, name)}"
        elif word in NOT_REPEATED:
            continue
        elif word in PATH_OPTIONS:
            option = word
        args.append(word)
    given = os.environ.get("PYTHONPATH", "")  # an empty entry of a non-empty one is the current folder
    paths = [str(CHECKOUT), *(_absolute(p, "PYTHONPATH") if p else os.getcwd() for p in (given.split(os.pathsep) if given else []))]
    return " ".join([*repro_env(paths), shlex.join([sys.executable, "-P", "-m", "harness", *args])])


def repro_env(python_path: list[str]) -> list[str]:
    """The words a rerun's interpreter comes after: the unset variables of REPRO_UNSET kept unset (env -u), the set ones
    of REPRO_ENV (paths absolute) and PYTHONPATH=`python_path`."""
    env = [f"{k}={shlex.quote(_absolute(os.environ[k], k) if k in PATH_ENV else os.environ[k])}" for k in REPRO_ENV if k in os.environ]
    env.append(f"PYTHONPATH={shlex.quote(os.pathsep.join(dict.fromkeys(python_path)))}")
    unset = [f"-u {k}" for k in REPRO_UNSET if k not in os.environ]
    env_command = "/usr/bin/env" if os.path.exists("/usr/bin/env") else "env"  # not another `env` first on PATH
    return [*([env_command, *unset] if unset else []), *env]


def pin_options(argv: list[str], resolved: dict[str, str]) -> list[str]:
    """`argv` with each option of `resolved` (option: the value this run resolved it to) given as that value, the
    user's own spelling of it (`--opt v`, `--opt=v`) dropped: a default that depends on the machine (`--device auto`
    is cuda:0 on a GPU host, cpu elsewhere; the scale, the slots a CPU pool grew to, the backend and the repeats
    follow it) then reruns as it ran here."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in resolved:
            skip = True
        elif word.partition("=")[0] not in resolved:
            out.append(word)
    return [*out, *(w for option, value in resolved.items() for w in (option, value))]


def pin_case(argv: list[str], device, case, more: dict[str, str] | None = None) -> list[str]:
    """`argv` with what every command's case resolved on this machine pinned (pin_options): the device, the scale and
    the slots (a CPU pool grown to fit), and `more` (the command's own)."""
    return pin_options(argv, {"--device": str(device), "--scale": case.scale.name, "--slots": str(case.scale.slots), **(more or {})})


def _absolute(path: str, option: str) -> str:
    """`path` from the current folder, its ".." kept: `link/../x` is x beside the link's target, which abspath's
    lexical folding would name another file."""
    if path == "none" or (option in COMMAND_OPTIONS and os.sep not in path):  # `--allreduce-table none` is no path
        return path
    return str(Path.cwd() / path)


def workload_digest(case, extra: dict | None = None) -> str:
    """sha256 of what `case` (harness.inputs.cases.Case) measures beyond its names: its spec (the preset's and
    the scenario's definitions, the generator, the seed) and the command's `extra` (tpot: the model and its flags).
    A scenario file named like a built-in, an edited preset or a shrunk model is another workload; an edited
    scenario description is not."""
    spec = {"case": case.spec(), **(extra or {})}
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=_plain).encode()).hexdigest()


def case_record(case, backend: str, kernel: str, command: str = "run", extra: dict | None = None) -> Case:
    """The case record of a `command` (run or tpot): `case` (harness.inputs.cases.Case), the backend its rows
    name, the kernel choice, and the workload's digest (with the command's `extra`, see workload_digest)."""
    return Case(command=command, preset=case.preset.name, scenario=case.scenario.name, scale=case.scale.name, slots=case.scale.slots,
                layers=case.num_layers, backend=backend, kernel=kernel, workload=workload_digest(case, extra), workload_v4=None)


def _plain(value):
    """numpy scalars as Python numbers (what json writes); dataclasses (a model shape) as their fields."""
    if isinstance(value, np.generic):
        return value.item()
    if is_dataclass(value):
        return asdict(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def document(rows: list[Row], env: dict, repro: str, case: Case | None = None) -> dict:
    """The results document (checked against the schema it will be read with). Every row's metric must
    be declared in the metric table; each row records whether it gates on this device (`gates_on`).
    Without `case`, the rows' own case fields are used (slots/layers not recorded), and the command their metrics
    declare (`_command`)."""
    validate_rows(rows)
    if case is None:
        first = rows[0] if rows else None
        case = Case(command=_command(rows), **{f: getattr(first, f, "") for f in ROW_CASE_FIELDS}, slots=None, layers=None,
                    kernel="auto", workload=None, workload_v4=None)
    device_type = str(env.get("device") or "cpu").split(":")[0]
    doc = json.loads(json.dumps({
        "schema": SCHEMA,
        "case": {f: getattr(case, f) for f in CASE_FIELDS},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "environment": env,
        "repro": repro,
        "rows": [{**asdict(r), "gating": METRICS[r.metric].gates(device_type)} for r in rows],
    }, default=_plain))
    parse_results(doc, "results being written")  # a writer never writes what the readers refuse
    return doc


def _command(rows: list[Row]) -> str:
    """The one command (schema.Command) whose results every row's metric belongs to (metrics.Metric.commands)."""
    commands = set(get_args(Command)).intersection(*(METRICS[r.metric].commands for r in rows))
    if len(commands) != 1:
        metrics = ", ".join(dict.fromkeys(r.metric for r in rows)) or "none"
        owners = " and ".join(sorted(commands)) or "no one command"
        raise HarnessError("rows", f"their metrics ({metrics}) belong to {owners}: pass the case record (`case`)")
    return commands.pop()


def write_results(path: str | Path, rows: list[Row], env: dict, repro: str, case: Case | None = None) -> None:
    """Write the results document of `rows` (see `document`) to the path --json gave."""
    write_text(path, json.dumps(document(rows, env, repro, case), indent=1) + "\n", "--json")
