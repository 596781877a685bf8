"""The gate's decision rule: a bootstrap confidence interval on the ratio of medians.

For one metric, base and head each carry their repeated samples. The ratio
head median / base median gets a percentile-bootstrap interval (CONFIDENCE,
RESAMPLES resamples of each side, fixed seed: the same inputs always give the same
answer). With "worse" the ratio oriented so that > 1 is a slowdown (head/base for
lower-is-better, base/head for higher-is-better) and t the tolerance
(--max-regression):

- regressed:    the whole interval lies above 1 + t;
- inconclusive: the interval straddles 1 + t (the samples cannot tell; the MDE says
                what they can resolve);
- slower:       the whole interval lies above 1 but below 1 + t (a real slowdown
                within the tolerance: reported, never gating);
- improved:     the whole interval lies below 1 / (1 + t);
- unchanged:    anything else (the interval holds 1 and stays below 1 + t), and always when
                the two medians are equal (with enough samples);
- undersampled: fewer than MIN_SAMPLES samples on either side, whatever the medians: no interval.
A sample that is NaN or infinite (the schema refuses them; the rule does not rely on it) gives `inconclusive`
with the note "non-finite samples", never a status from a NaN interval (every comparison with NaN is False:
unguarded, it reads as `unchanged`).

The interval is computed on log ratios (log median(head) - log median(base)), so samples anywhere in
the schema's range (1e-300 against 1e300) neither overflow nor reach log(0); ratio, low and high are
its exponentials (inf or 0 beyond float range).

A change of the medians below the metric's `resolution` (absolute, in its unit) is never
regressed or inconclusive: `slower` when the interval lies above 1, else `unchanged`, with a
note saying so. A faster head (point ratio on the better side of 1) is never `slower`.

False-alarm rate: a change exactly at the tolerance is called a regression only when
the lower end of a 99% two-sided interval clears it, i.e. with probability about 0.5%
(the interval's one-sided miss rate) from about 10 samples a side; with fewer the percentile
interval of a median is too narrow (measured 0.65-0.78% at 5 samples: docs/gating.md); no change at all (A/A) needs the interval to
clear 1 + t, which the A/A tests in suites/test_decision_rule.py never saw.
MDE (minimum detectable change): half the interval's width as a relative change,
exp((ln hi - ln lo) / 2) - 1: a shift smaller than this cannot be told from noise.

Bounded memory: each side's samples are capped at MAX_SAMPLES (more are thinned to that many
evenly spaced order statistics, which keeps their distribution and gives a wider interval, never
a narrower one), and the resamples are drawn in chunks of at most CHUNK indices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.99
RESAMPLES = 2000
MIN_SAMPLES = 5  # fewer timed samples on either side: no interval, undersampled
SEED = 20240611
MAX_SAMPLES = 4096  # per side; see "Bounded memory" above
CHUNK = 1 << 22  # resample indices drawn at once (32 MiB of int64)

REGRESSED, INCONCLUSIVE, SLOWER, UNCHANGED, IMPROVED = "regressed", "inconclusive", "slower", "unchanged", "improved"
UNDERSAMPLED = "undersampled"


@dataclass(frozen=True)
class Decision:
    status: str
    ratio: float  # head median / base median
    low: float | None  # the interval on head/base; None without enough samples
    high: float | None
    mde: float | None  # relative (0.02 = 2%)
    note: str = ""


def _thinned(values: np.ndarray) -> np.ndarray:
    """The sorted values, at most MAX_SAMPLES of them (evenly spaced order statistics)."""
    ordered = np.sort(values)
    if ordered.size <= MAX_SAMPLES:
        return ordered
    return ordered[np.round(np.linspace(0, ordered.size - 1, MAX_SAMPLES)).astype(np.int64)]


def _bootstrap_medians(values: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """Medians of `resamples` resamples with replacement. On sorted values, the k-th smallest
    drawn index picks the k-th smallest drawn value, so sorting indices replaces sorting values."""
    ordered = _thinned(values)
    n = ordered.size
    per_chunk = max(1, CHUNK // n)
    medians = np.empty(resamples)
    for start in range(0, resamples, per_chunk):
        picks = np.sort(rng.integers(0, n, (min(per_chunk, resamples - start), n)), axis=1)
        medians[start:start + len(picks)] = (ordered[picks[:, (n - 1) // 2]] + ordered[picks[:, n // 2]]) / 2
    return medians


def bootstrap_log_ratios(base, head, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """`resamples` bootstrap draws of log median(head) - log median(base) (fixed seed: always the same draws)."""
    a, b = np.asarray(base, dtype=float), np.asarray(head, dtype=float)
    rng = np.random.default_rng(seed)
    return np.log(_bootstrap_medians(b, rng, resamples)) - np.log(_bootstrap_medians(a, rng, resamples))


def log_ratio_interval(base, head, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(point, low, high) of log median(head) - log median(base): the two-sided percentile bootstrap interval."""
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(bootstrap_log_ratios(base, head), [tail, 100 - tail])
    return float(np.log(np.median(head)) - np.log(np.median(base))), float(low), float(high)


def _exp(x: float) -> float:
    """e**x, inf beyond float range."""
    with np.errstate(over="ignore"):
        return float(np.exp(x))


def decide(base, head, better: str, tolerance: float, confidence: float = CONFIDENCE, resolution: float = 0.0) -> Decision:
    """Judge head's samples against base's for a metric where `better` is "lower" or "higher".
    `resolution`: an absolute change of the medians below it is never regressed or inconclusive."""
    if not (np.all(np.isfinite(base)) and np.all(np.isfinite(head))):  # NaN compares False: unguarded, it reads as unchanged
        return Decision(INCONCLUSIVE, math.nan, None, None, None, "non-finite samples: no ratio")
    if min(len(base), len(head)) < MIN_SAMPLES:
        ratio = _exp(np.log(np.median(head)) - np.log(np.median(base))) if len(base) and len(head) else math.nan
        return Decision(UNDERSAMPLED, ratio, None, None, None,
                        f"too few samples ({len(base)} vs {len(head)}, need {MIN_SAMPLES} on each side)")
    if np.median(base) == np.median(head):
        return Decision(UNCHANGED, 1.0, None, None, None)
    if min(np.min(base), np.min(head)) <= 0:
        return Decision(INCONCLUSIVE, math.nan, None, None, None, "non-positive samples: no ratio")
    point, low, high = log_ratio_interval(base, head, confidence)
    mde = _exp((high - low) / 2) - 1
    worse, worse_low, worse_high = (point, low, high) if better == "lower" else (-point, -high, -low)  # logs
    limit = math.log1p(tolerance)
    if worse_low > limit:
        status = REGRESSED
    elif worse_high > limit:
        status = INCONCLUSIVE
    elif worse_low > 0:
        status = SLOWER
    elif worse_high < -limit:
        status = IMPROVED
    else:
        status = UNCHANGED
    note = ""
    change = abs(float(np.median(head)) - float(np.median(base)))
    if status in (REGRESSED, INCONCLUSIVE) and change < resolution:
        status, note = SLOWER, f"change {change:.3g} is below the metric's resolution {resolution:g}"
    if status == SLOWER and not (worse_low > 0 and worse > 0):
        status = UNCHANGED  # a faster head, or an interval that holds 1, is never called slower
    return Decision(status, _exp(point), _exp(low), _exp(high), mde, note)
