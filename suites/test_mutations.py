"""Mutation smoke test: realistic faults planted in a copy of the source tree must make the
targeted suites fail. A check that silently stops failing is noticed here.

Each mutation replaces one exact source line (the test fails if the line is gone, so a
refactor must update it) and runs the tests that should catch it; one child process runs
them all (torch is imported once), each on a fresh copy with freshly imported modules.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("harness", "suites", "golden", "conftest.py", "pyproject.toml")
NAN_TEST = "suites/test_negative_controls.py::test_nan_code_propagates_to_the_output"
ALL_PASS = "suites/test_strategies_cpu.py::test_all_strategies_pass_golden[glm5-tp8.ci.b1-l500]"

# (id, file, exact original text, mutated text, tests that must fail)
MUTATIONS = [
    ("output-rounded-to-float16", "harness/backends/torch_backend.py",
     "outs.append((torch.exp(logits - lse[:, None]) @ c).to(torch.bfloat16))",
     "outs.append((torch.exp(logits - lse[:, None]) @ c).to(torch.float16))", [ALL_PASS]),
    ("stock-casts-pool-to-float16", "harness/strategies/stock.py",
     "return pool_u8.view(torch.float8_e4m3fn).to(torch.bfloat16)",
     "return pool_u8.view(torch.float8_e4m3fn).to(torch.float16)", [ALL_PASS]),
    ("nan-code-decoded-as-480", "harness/backends/torch_backend.py",
     "c = ckv2.index_select(0, idx).to(torch.float32)",
     "c = ckv2.index_select(0, idx).to(torch.float32).nan_to_num(480.0)", [NAN_TEST]),
    ("manifest-hash-not-checked", "harness/golden.py",
     'if manifest_digest(manifest) != manifest.get("manifest_sha256"):', "if False:",
     ["suites/test_golden.py::test_manifest_fields_are_hashed_and_typed"]),
    ("element-tolerance-ignored", "harness/check.py",
     "bad = ~(diff <= atol + rtol * e.abs())", "bad = diff != diff",
     ["suites/test_check.py"]),
    ("unfirable-fault-accepted", "harness/negative_controls.py",
     "if targets and not any(t in strategies for t in targets):", "if False:",
     ["suites/test_cli.py::test_unfirable_faults_exit_2"]),
    ("session-skips-dtype-contract", "harness/decode.py",
     "check_boundary(strategy.name, strategy.kv_dtype, q_nope, *kv, out, lse)", "pass",
     ["suites/test_extending.py::test_toy_strategy_gets_the_session_dtype_contract"]),
    ("fused-fp8-scale-fault-unclaimed", "harness/strategies/fused_fp8.py",
     "faults=(Fault.SCALE_ERROR,))", ")",
     ["suites/test_negative_controls.py::test_a_fault_claimed_by_two_strategies_reaches_each_and_no_other"]),
]


def _mutated_copy(dest: Path, file: str, original: str, mutated: str) -> None:
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    path = dest / file
    text = path.read_text()
    assert text.count(original) == 1, f"{file} no longer holds {original!r}: update this mutation"
    path.write_text(text.replace(original, mutated))


def _run_all(workdir: Path) -> dict[str, int]:
    """In this (child) process: for each mutation, a mutated copy, fresh harness modules, and
    pytest.main on its tests. torch is imported once for all of them."""
    codes = {}
    for name, file, original, mutated, tests in MUTATIONS:
        copy = workdir / name
        _mutated_copy(copy, file, original, mutated)
        stale = ("harness", "suites", "ci")  # packages of the previous copy (suites: its plugins and helpers)
        for mod in [m for m in sys.modules if m in stale or m.startswith(tuple(f"{p}." for p in stale) + ("test_",)) or m == "conftest"]:
            del sys.modules[mod]
        sys.path.insert(0, str(copy))
        os.chdir(copy)
        codes[name] = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly", *tests]))
        sys.path.remove(str(copy))
    return codes


@pytest.mark.slow
def test_mutations_are_caught(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLA_HARNESS_")}  # no CI skip guard in the copies
    proc = subprocess.run([sys.executable, __file__, str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    codes = json.loads(proc.stdout.strip().splitlines()[-1])
    missed = [name for name, code in codes.items() if code != pytest.ExitCode.TESTS_FAILED]
    assert not missed and len(codes) == len(MUTATIONS), f"mutations not caught: {missed}\n{proc.stdout[-3000:]}"


if __name__ == "__main__":
    print(json.dumps(_run_all(Path(sys.argv[1]))))
