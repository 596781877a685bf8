"""Every MLA_HARNESS_*, MLA_ASV_* and MLA_SGLANG_* environment variable, declared once (name, kind, bounds,
who reads it, meaning) and parsed here: a bad value is one HarnessError naming the variable.

`python -m harness.envvars` checks every variable that is set (exit 2 on the first bad one);
`--markdown` prints the table docs/environment.md carries (suites/test_envvars.py keeps them equal).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from harness.datafiles import MAX_INT_DIGITS
from harness.errors import HarnessError

KINDS = ("path", "text", "flag", "int", "names")


@dataclass(frozen=True)
class EnvVar:
    name: str
    kind: str  # one of KINDS; "flag" is 0 or 1, "names" a comma list
    read_by: str
    meaning: str
    minimum: int | None = None  # "int"
    maximum: int | None = None
    names_from: str = ""  # "names": "module:attribute", a sequence or a function returning the allowed names
    names_are: str = ""  # "names": what they name, for the docs

    def bounds(self) -> str:
        if self.kind == "int":
            return f"integer {self.minimum}..{self.maximum}"
        if self.kind == "names":
            return f"comma list of {self.names_are}"
        return {"flag": "0 or 1", "path": "a path", "text": "text"}[self.kind]


MAX_REPEATS = 10_000  # timing samples per metric: --repeats of run and tpot (harness.spec.scenario), MLA_ASV_REPEATS

VARIABLES = (
    EnvVar("MLA_HARNESS_GOLDEN_DIR", "path", "`run`, `golden`", "the golden folder (default `golden/` of the checkout; `--golden-dir` wins)"),
    EnvVar("MLA_HARNESS_GIT_COMMIT", "text", "results writer", "the commit recorded in results, in place of the checkout's `git rev-parse HEAD` (set it where the checkout has no `.git`, e.g. a copy on a GPU box)"),
    EnvVar("MLA_HARNESS_SGLANG_COMMIT", "text", "results writer (set by `ci.sglang_gate --json`)",
           "the SGLang commit recorded in results when the run imports an SGLang that is not a git checkout (a commit installed without its .git)"),
    EnvVar("MLA_HARNESS_STRICT_SKIPS", "flag", "pytest (set by `.ci/run`)",
           "1: fail the session when a test that is not `gpu`/`sglang`-marked was skipped and did not pass elsewhere "
           "(the Triton interpreter child)"),
    EnvVar("MLA_HARNESS_PASSED_ELSEWHERE", "path", "pytest, internal",
           "folder where a child pytest run (the Triton interpreter) lists what passed there, for the skip guard"),
    EnvVar("MLA_HARNESS_INTERPRETER_CHILD", "flag", "pytest, internal",
           "1 marks the child pytest run under `TRITON_INTERPRET=1` (`suites/plugins/triton_interpreter.py`)"),
    EnvVar("MLA_HARNESS_NUM_GPUS", "int", "pytest GPU binding",
           "how many GPUs the xdist workers bind to when `CUDA_VISIBLE_DEVICES` is unset", 1, 1024),
    EnvVar("MLA_HARNESS_LOCK_DIR", "path", "pytest GPU binding", "folder of the per-GPU timing locks (default `<tmp>/mla-harness-gpu-locks`)"),
    EnvVar("MLA_HARNESS_OFFLINE_BUNDLE", "path", "`ci/setup_gpu_runner.sh`", "the FlashInfer offline bundle to install on an air-gapped runner"),
    EnvVar("MLA_ASV_SCENARIOS", "names", "asv benchmarks", "the scenarios benchmarked (default b1-l4096,b32-l4096 on CUDA, b1-l500 on CPU)",
           names_from="harness.spec.scenario:builtin_names", names_are="built-in scenarios"),
    EnvVar("MLA_ASV_STRATEGIES", "names", "asv benchmarks", "the strategies benchmarked (default: the registry's `BENCHMARKED`)",
           names_from="harness.strategies:ORDER", names_are="registered strategies"),
    EnvVar("MLA_ASV_PRESETS", "names", "asv benchmarks", "the model presets benchmarked (default: every preset the checkout declares on CUDA, glm5-tp8 on CPU)",
           names_from="harness.spec.presets:PRESETS", names_are="model presets"),
    EnvVar("MLA_SGLANG_REPO", "path", "`ci.sglang_gate` (set by `sglang-gate.yml`)", "your SGLang git checkout, when `--sglang-repo` is not given"),
    EnvVar("MLA_ASV_REPEATS", "int", "asv benchmarks", "samples per benchmark (default 30 / 20 TPOT on CUDA, 3 / 2 on CPU)", 1, MAX_REPEATS),
    EnvVar("MLA_ASV_TPOT", "flag", "asv `bench_tpot.py`", "1: run the TPOT benchmarks on CPU too"),
    EnvVar("MLA_ASV_ALLREDUCE_TABLE", "path", "asv `bench_tpot.py`",
           "add the measured all-reduce latency stand-in (a table path) to the TPOT benchmarks"),
)
BY_NAME = {v.name: v for v in VARIABLES}


def allowed_names(var: EnvVar) -> list[str]:
    """The names a "names" variable may list, from where its declaration says (imported on use)."""
    module, attribute = var.names_from.split(":")
    found = getattr(importlib.import_module(module), attribute)
    return list(found() if callable(found) else found)


def parse(var: EnvVar, raw: str, check_names: bool = True):
    """`raw` as the declared kind: str, bool, int, or a tuple of names (checked when check_names)."""
    if var.kind in ("path", "text"):
        if not raw.strip():
            raise HarnessError(var.name, f"is set but empty; unset it or give {var.bounds()}")
        if var.kind == "text" and not (raw.isprintable() and _utf8(raw)):
            raise HarnessError(var.name, f"must be printable UTF-8 text, got {raw!r}")
        return raw
    if var.kind == "flag":
        if raw not in ("0", "1"):
            raise HarnessError(var.name, f"must be 0 or 1, got {raw!r}")
        return raw == "1"
    if var.kind == "int":
        if not re.fullmatch(r"-?[0-9]+", raw.strip()):
            raise HarnessError(var.name, f"must be an integer {var.minimum}..{var.maximum}, got {raw!r}")
        if (digits := len(raw.strip().lstrip("-"))) > MAX_INT_DIGITS:
            raise HarnessError(var.name, f"must be {var.minimum}..{var.maximum}, got a {digits}-digit number")
        value = int(raw)
        if not var.minimum <= value <= var.maximum:
            raise HarnessError(var.name, f"must be {var.minimum}..{var.maximum}, got {value}")
        return value
    names = tuple(n.strip() for n in raw.split(","))
    if not all(names):
        raise HarnessError(var.name, f"must be a comma list of names with none empty, got {raw!r}")
    if len(set(names)) != len(names):
        raise HarnessError(var.name, f"lists a name twice: {raw!r}")
    if check_names:
        allowed = allowed_names(var)
        if unknown := [n for n in names if n not in allowed]:
            raise HarnessError(var.name, f"unknown name {unknown[0]!r}; choose from {', '.join(allowed)}")
    return names


def _utf8(text: str) -> bool:
    """Whether `text` is valid UTF-8 (an environment's undecodable bytes arrive as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read(name: str, environ: Mapping[str, str] | None = None, check_names: bool = True):
    """The parsed value of the declared variable `name`, or None when it is unset."""
    raw = (os.environ if environ is None else environ).get(name)
    return None if raw is None else parse(BY_NAME[name], raw, check_names)


TRITON_TRUE = ("1", "true", "on", "yes", "y")  # what Triton's own getenv_bool reads as on, in any case


def triton_interpreted(value: str | None) -> bool:
    """Whether a TRITON_INTERPRET value (None: unset) makes Triton run its kernels in the interpreter, as Triton
    reads it (`0`, an empty or an unknown value do not)."""
    return value is not None and value.lower() in TRITON_TRUE


def markdown() -> str:
    rows = ["| variable | value | read by | meaning |", "|---|---|---|---|"]
    rows += [f"| `{v.name}` | {v.bounds()} | {v.read_by} | {v.meaning} |" for v in VARIABLES]
    return "\n".join(rows)


def check_all(kinds: tuple[str, ...] = KINDS) -> list[str]:
    """Parse every declared variable of `kinds` that is set (HarnessError on the first bad one); their names."""
    return [v.name for v in VARIABLES if v.kind in kinds and read(v.name) is not None]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--markdown"]:
        print(markdown())
        return 0
    if args:
        print(f"usage: python -m harness.envvars [--markdown]\n{__doc__.splitlines()[0]}", file=sys.stderr)
        return 0 if args[0] in ("-h", "--help") else 2
    try:
        checked = check_all()
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"ok: {', '.join(checked) or 'no MLA_HARNESS_* / MLA_ASV_* / MLA_SGLANG_* variable set'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
