"""Bucket replay of a step smaller than its bucket's first, through SGLang's own decode path and KV write: the
padding lanes must write nothing (row 0), not the earlier step's rows into slots another request now holds
(the harness's strategies: suites/test_graph_buckets.py)."""

from __future__ import annotations

import pytest
import sgl

from suites.helpers import assert_replay_equals_eager, shrunk_step_case

pytestmark = pytest.mark.sglang


def test_a_shrunk_step_replays_as_the_eager_step():
    sgl.require()
    assert_replay_equals_eager(shrunk_step_case(), "sglang_flashinfer")
