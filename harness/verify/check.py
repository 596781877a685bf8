"""Verdicts: error statistics against a golden, tolerance policy, bitwise tier, dtype contract."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path

import msgspec
import torch

from harness.backends import backend_family, backend_keys
from harness.backends.contract import OUT_WIDTH, ContractViolation, check_boundary  # noqa: F401  (the contract's home; re-exported)
from harness.datafiles import read_toml
from harness.errors import HarnessError
from harness.results.schema import ErrorStats
from harness.strategies import ORDER, REGISTRY

POLICY_FILE = Path(__file__).with_name("tolerances.toml")


class Status(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    UNSUPPORTED = "unsupported"
    ERROR = "error"


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    max_norm_rel: float  # ||out - gold|| / ||gold|| over the whole tensor
    lse_atol: float
    # |sum((out - gold) * sign(gold))| / sum(|gold|): the outputs' systematic shrink or growth (a biased
    # rounding, a scaled V); unbiased errors average out of it. Required in tolerances.toml; inf: not checked.
    max_bias: float = math.inf


@dataclass(frozen=True)
class Verdict:
    status: Status
    reason: str = ""
    stats: ErrorStats | None = None

    @property
    def passed(self) -> bool:
        return self.status == Status.PASS

    def to_dict(self) -> dict:
        return {"status": self.status.value, "reason": self.reason, "stats": msgspec.structs.asdict(self.stats) if self.stats else None}


BACKEND_KEYS = backend_keys()  # tolerance rows may name a backend or its family


def load_policy(path: Path) -> dict[str, Tolerance]:
    """{key: Tolerance} of a tolerances TOML, every key checked against the strategy registry: "<strategy>" or
    "default", alone or as "<strategy or default>.<backend or family>"; a typo is an error naming the key."""
    table = read_toml(path).get("tolerance")
    if not isinstance(table, dict) or "default" not in table:
        raise HarnessError(f"{path}: tolerance", "needs [tolerance.*] tables including [tolerance.default]")
    names = {f.name for f in fields(Tolerance)}
    out = {}
    for key, entry in table.items():
        where = f"{path}: tolerance.{key}"
        strategy, _, backend = key.partition(".")
        if strategy != "default" and strategy not in REGISTRY:
            raise HarnessError(where, f"unknown strategy {strategy!r}; registered: {', '.join(REGISTRY)}")
        if backend and backend not in BACKEND_KEYS:
            raise HarnessError(where, f"unknown backend {backend!r}; choose from {', '.join(BACKEND_KEYS)}")
        if not isinstance(entry, dict) or set(entry) != names or not all(isinstance(v, (int, float)) for v in entry.values()):
            raise HarnessError(where, f"needs exactly the numbers {', '.join(sorted(names))}")
        out[key] = Tolerance(**{k: float(v) for k, v in entry.items()})
    return out


@functools.cache
def default_policy() -> dict[str, Tolerance]:
    """tolerances.toml, loaded and validated once per process."""
    return load_policy(POLICY_FILE)


class _KVContract(Mapping):
    """strategy -> the KV dtype it hands the attention backend: its register(kv_dtype=...), read from the
    registry at each use (SGLang casts the pool to the query dtype, bf16; the FP8 paths pass e4m3)."""

    def __getitem__(self, strategy: str) -> torch.dtype:
        return REGISTRY[strategy].kv_dtype

    def __iter__(self):
        return iter(ORDER)

    def __len__(self) -> int:
        return len(REGISTRY)


KV_CONTRACT = _KVContract()


def check_contract(strategy: str, q_nope, ckv, kpe, out, lse) -> None:
    """The attention boundary for a registered strategy (harness.backends.contract.check_boundary with its
    declared kv_dtype): queries bf16, KV of the strategy's contract dtype (ckv and kpe alike), output
    bf16 [B, H, 512], LSE fp32 [B, H]. Raises ContractViolation."""
    check_boundary(strategy, KV_CONTRACT.get(strategy), q_nope, ckv, kpe, out, lse)


def policy(strategy: str, backend: str) -> Tolerance:
    """The tolerance for (strategy, backend) from tolerances.toml: the strategy's own row, else the backend's
    default ("default.<backend>", a family sharing one), else "default"."""
    table = default_policy()
    family = backend_family(backend)
    for key in (f"{strategy}.{backend}", f"{strategy}.{family}", strategy):
        if key in table:
            return table[key]
    return next(table[key] for key in (f"default.{backend}", f"default.{family}", "default") if key in table)


def error_stats(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> ErrorStats:
    a, e = actual.double(), expected.double()
    diff = (a - e).abs()
    nonfinite = int((~torch.isfinite(a)).sum())
    bad = ~(diff <= atol + rtol * e.abs())  # NaN compares false, so NaN is always bad
    score = torch.where(torch.isfinite(diff), diff - rtol * e.abs(), torch.full_like(diff, float("inf")))
    worst = tuple(int(i) for i in torch.unravel_index(torch.argmax(score), score.shape)) if score.numel() else ()
    finite = torch.isfinite(diff)
    max_abs = float(diff[finite].max()) if bool(finite.any()) else 0.0
    rel = diff / e.abs().clamp_min(1e-30)
    max_rel = float(rel[finite].max()) if bool(finite.any()) else 0.0
    norm = float(torch.linalg.vector_norm(torch.where(finite, a - e, 0.0)) / torch.linalg.vector_norm(e).clamp_min(1e-30))
    total = diff.numel()
    mismatches = int(bad.sum())
    return ErrorStats(
        max_abs=max_abs if nonfinite == 0 else float("inf"),
        max_rel=max_rel if nonfinite == 0 else float("inf"),
        norm_rel=norm if nonfinite == 0 else float("inf"),
        mismatches=mismatches,
        total=total,
        matched_ratio=(total - mismatches) / total if total else 1.0,
        worst_index=worst,
        nonfinite=nonfinite,
    )


def signed_bias(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """sum((actual - expected) * sign(expected)) / sum(|expected|) over the finite elements: the mean relative
    shrink (< 0) or growth (> 0) of the outputs' magnitudes. Round-to-nearest and other unbiased errors cancel
    in it (their sum grows as sqrt(n)); a rounding toward zero or a scaled output does not."""
    a, e = actual.double(), expected.double()
    finite = torch.isfinite(a)
    den = float(torch.where(finite, e.abs(), 0.0).sum())
    return float(torch.where(finite, (a - e) * e.sign(), 0.0).sum()) / den if den > 0 else 0.0


def check_against_golden(out, lse, gold_out, gold_lse, tol: Tolerance) -> Verdict:
    """Per-element |out-gold| <= atol + rtol*|gold|, norm-relative error, signed bias, LSE; NaN/Inf always fail."""
    if out.shape != gold_out.shape or lse.shape != gold_lse.shape:
        return Verdict(Status.FAIL, f"shape {tuple(out.shape)} != golden {tuple(gold_out.shape)}")
    stats = error_stats(out, gold_out, tol.atol, tol.rtol)
    lse_err = (lse.double() - gold_lse.double()).abs()
    reasons = []
    if stats.nonfinite:
        reasons.append(f"{stats.nonfinite} non-finite outputs")
    if stats.mismatches:
        reasons.append(f"{stats.mismatches}/{stats.total} elements outside atol={tol.atol:g} rtol={tol.rtol:g}, worst at {stats.worst_index}")
    if stats.norm_rel > tol.max_norm_rel:
        reasons.append(f"norm-relative error {stats.norm_rel:.3g} > {tol.max_norm_rel:g}")
    if abs(bias := signed_bias(out, gold_out)) > tol.max_bias:
        reasons.append(f"outputs biased {bias:+.3g} (signed relative) beyond {tol.max_bias:g}: a rounding toward zero or a scaled output")
    if not bool((lse_err <= tol.lse_atol).all()):
        reasons.append(f"LSE error {float(lse_err.nan_to_num(float('inf')).max()):.3g} > {tol.lse_atol:g}")
    return Verdict(Status.FAIL if reasons else Status.PASS, "; ".join(reasons), stats)


def check_bitwise(out, lse, ref_out, ref_lse, ref_name: str) -> Verdict:
    """The exactness tier: identical bits to `ref_name`'s output on the same backend and plan."""
    if out.shape != ref_out.shape:
        return Verdict(Status.FAIL, f"shape differs from {ref_name}")
    diff = out.view(torch.int16) != ref_out.view(torch.int16)
    n = int(diff.sum())
    if n or not torch.equal(lse.view(torch.int32), ref_lse.view(torch.int32)):
        where = tuple(int(i) for i in diff.nonzero()[0]) if n else "lse"
        return Verdict(Status.FAIL, f"not bitwise equal to {ref_name}: {n} of {out.numel()} outputs differ (first at {where})")
    return Verdict(Status.PASS)


def agreement_tolerance(tol: Tolerance, ref_tol: Tolerance) -> Tolerance:
    """How far two outputs may differ when each is within its tolerance of the same golden g (triangle
    inequality): |a - r| <= (atol_a + atol_r) + (rtol_a + rtol_r) |g|, with |g| <= (|r| + atol_r) / (1 - rtol_r)
    bounding the golden by the reference output r; norms alike; LSE errors add."""
    r = tol.rtol + ref_tol.rtol
    return Tolerance(atol=tol.atol + ref_tol.atol + r * ref_tol.atol / (1 - ref_tol.rtol), rtol=r / (1 - ref_tol.rtol),
                     max_norm_rel=(tol.max_norm_rel + ref_tol.max_norm_rel) / (1 - ref_tol.max_norm_rel),
                     lse_atol=tol.lse_atol + ref_tol.lse_atol)


def check_agreement(out, lse, ref_out, ref_lse, tol: Tolerance, ref_name: str) -> Verdict:
    """Every request (the golden stores a few) within `tol` (agreement_tolerance) of `ref_name`'s output: a fault
    confined to requests the golden does not store (one request's indices, a second wave of CTAs) fails here."""
    if out.shape != ref_out.shape or lse.shape != ref_lse.shape:
        return Verdict(Status.FAIL, f"shape {tuple(out.shape)} differs from {ref_name}'s {tuple(ref_out.shape)}")
    stats = error_stats(out, ref_out, tol.atol, tol.rtol)
    lse_err = (lse.double() - ref_lse.double()).abs().nan_to_num(float("inf"))
    reasons = []
    if stats.mismatches:
        reasons.append(f"{stats.mismatches}/{stats.total} elements outside atol={tol.atol:.3g} rtol={tol.rtol:.3g} "
                       f"of {ref_name}, worst at {stats.worst_index}")
    if stats.norm_rel > tol.max_norm_rel:
        reasons.append(f"norm-relative difference from {ref_name} {stats.norm_rel:.3g} > {tol.max_norm_rel:.3g}")
    if not bool((lse_err <= tol.lse_atol).all()):
        worst = int(lse_err.max(dim=-1).values.argmax())
        reasons.append(f"LSE differs from {ref_name}'s by {float(lse_err.max()):.3g} > {tol.lse_atol:.3g} (request {worst})")
    if reasons:
        return Verdict(Status.FAIL, "all requests against " + ref_name + ": " + "; ".join(reasons))
    return Verdict(Status.PASS)


SEVERITY = (Status.PASS, Status.UNSUPPORTED, Status.FAIL, Status.ERROR)


def merge_stats(all_stats: list[ErrorStats]) -> ErrorStats | None:
    """Statistics over several checked tensors: maxima of the errors, sums of the counts."""
    if not all_stats:
        return None
    worst = max(all_stats, key=lambda s: (s.nonfinite, s.norm_rel))
    mismatches, total = sum(s.mismatches for s in all_stats), sum(s.total for s in all_stats)
    return ErrorStats(
        max_abs=max(s.max_abs for s in all_stats),
        max_rel=max(s.max_rel for s in all_stats),
        norm_rel=max(s.norm_rel for s in all_stats),
        mismatches=mismatches,
        total=total,
        matched_ratio=(total - mismatches) / total if total else 1.0,
        worst_index=worst.worst_index,
        nonfinite=sum(s.nonfinite for s in all_stats),
    )


def combine(verdicts: list[Verdict]) -> Verdict:
    """The most severe status wins; statistics cover every verdict; reasons are kept (a pass may say what it left unchecked).
    Checks that compared no element at all are a failure, never a pass."""
    stats = merge_stats([v.stats for v in verdicts if v.stats is not None])
    if stats is None or stats.total == 0:
        return Verdict(Status.FAIL, "nothing was checked: no golden element compared", stats)
    status = max((v.status for v in verdicts), key=SEVERITY.index)
    reasons = " | ".join(v.reason for v in verdicts if v.reason)
    return Verdict(status, reasons, stats)
