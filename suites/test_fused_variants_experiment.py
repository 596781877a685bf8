"""ci/experiments/fused_variants (issue 28's side-by-side kernel variants) on CPU: a variant's spec, its source (the
kernel with its #defines first) and its own kernel caches, with their twins (a bad spec, the base left untouched)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ci.experiments.fused_variants import fused_variants as exp
from harness.kernels import fused_mla_cuda


def test_variant_specs():
    assert exp.parse_variant("nomerge:DIAG_NO_MERGE=1,X=2") == exp.Variant("nomerge", {"DIAG_NO_MERGE": "1", "X": "2"})
    assert exp.parse_variant("base") == exp.Variant("base", {})
    assert exp.parse_variant("old@k/old.cu:X=2") == exp.Variant("old", {"X": "2"}, Path("k/old.cu"))
    with pytest.raises(ValueError):  # a define without a value
        exp.parse_variant("bad:DIAG_NO_MERGE")
    # lower-case items are Config fields of that variant alone, never #defines
    pp = exp.parse_variant("pp:ping_pong=1,DIAG_NO_MERGE=1,num_splits=4")
    assert pp == exp.Variant("pp", {"DIAG_NO_MERGE": "1"}, None, "ping_pong=1,num_splits=4")
    assert exp.config_fields(pp.config) == {"ping_pong": True, "num_splits": 4}
    with pytest.raises(SystemExit, match="--variant pp 'ping_pnog=1'"):  # a misspelt field is refused, not compiled as a define
        exp.config_fields(exp.parse_variant("pp:ping_pnog=1").config, "--variant pp")


def test_each_variant_compiles_its_own_source(tmp_path, monkeypatch):
    assert all(hasattr(getattr(fused_mla_cuda, name), "cache_clear") for name in fused_mla_cuda.SOURCE_CACHES)
    for name in ("SOURCE", *fused_mla_cuda.SOURCE_CACHES):
        monkeypatch.setattr(fused_mla_cuda, name, getattr(fused_mla_cuda, name))
    monkeypatch.setattr(exp, "_CACHES", {})
    exp.use_variant(exp.Variant("stream", {"DIAG_STREAM_ONLY": "1"}), tmp_path)
    stream_kernel = fused_mla_cuda._kernel
    text = fused_mla_cuda.SOURCE.read_text()
    assert fused_mla_cuda.SOURCE == tmp_path / "stream.cu"
    assert text.startswith("#define DIAG_STREAM_ONLY 1\n") and text.endswith(exp.fused_mla_cuda.SOURCE_TEXT)
    exp.use_variant(exp.Variant("base", {}), tmp_path)
    assert (tmp_path / "base.cu").read_text() == exp.fused_mla_cuda.SOURCE_TEXT  # the base is the kernel as committed
    other = tmp_path / "other-commit.cu"
    other.write_text("// another commit's kernel\n")
    exp.use_variant(exp.Variant("old", {"X": "2"}, other), tmp_path)
    assert fused_mla_cuda.SOURCE.read_text() == "#define X 2\n// another commit's kernel\n"  # its file, not the committed one
    assert fused_mla_cuda._kernel is not stream_kernel and fused_mla_cuda._kernel is not exp._ORIGINAL["_kernel"]
    exp.use_variant(exp.Variant("stream", {"DIAG_STREAM_ONLY": "1"}), tmp_path)
    assert fused_mla_cuda._kernel is stream_kernel  # compiled once per variant, kept across rounds
    # the committed kernel's diagnostics are off unless a variant defines them
    assert all(f"#define {d} 0" in exp.fused_mla_cuda.SOURCE_TEXT for d in ("DIAG_STREAM_ONLY", "DIAG_NO_MERGE", "DIAG_CLOCK", "DIAG_EARLY_Q"))


def test_config_fields_replace_the_table_entry_and_refuse_what_is_not_a_field():
    assert exp.config_fields("grid_merge=1,cluster_merge=0,num_splits=4") == {"grid_merge": True, "cluster_merge": False,
                                                                           "num_splits": 4}
    assert exp.config_fields(None) == {}
    for bad in ("splits=4", "num_splits=four", "grid_merge"):
        with pytest.raises(SystemExit, match="--config"):
            exp.config_fields(bad)


def test_a_bad_variant_field_is_refused_before_any_work(tmp_path):
    out = tmp_path / "v.json"
    with pytest.raises(SystemExit, match="--variant pp 'ping_pnog=1'"):
        exp.main(["time", str(out), "--variant", "pp:ping_pnog=1"])
    with pytest.raises(SystemExit, match="--config 'splits=4'"):
        exp.main(["time", str(out), "--config", "splits=4"])
    assert not out.exists()


def test_call_fields_default_to_fused_fp8s_call_and_are_not_config_fields():
    early = exp.parse_variant("wait:new_tokens=99999,num_splits=4")
    assert exp.call_fields(early.config) == {"new_tokens": 99999}
    assert exp.config_fields(early.config) == {"num_splits": 4}
    assert exp.call_fields(exp.parse_variant("pp:ping_pong=1").config) == {"new_tokens": 1}
    with pytest.raises(SystemExit, match="new_tokens"):
        exp.config_fields("new_tokens=x")


def _records(rows):
    """uint64 records as DIAG_CLOCK writes them: (pool, x, y, smid, merge_mode, tiles, nine globaltimer ns, wait and
    loop clocks)."""
    import numpy as np

    return np.array([[key, x | (y << 8) | (sm << 24) | (mode << 32) | (tiles << 40), *t, wait | (loop << 32)]
                     for key, x, y, sm, mode, tiles, t, wait, loop in rows], dtype=np.uint64)


def test_timeline_phases_per_launch_and_the_last_cta():
    # two layers; in each a cluster-launch CTA and one beside it (WAIT_PRIOR), the latter exiting last in layer 2
    recs = _records([
        (1, 0, 0, 0, 2, 16, (1000, 1200, 1500, 2500, 3000, 28000, 28500, 29500, 30000), 100, 1000),
        (1, 0, 1, 1, 1 | 4, 11, (1200, 1200, 1300, 2000, 2800, 20000, 20000, 20000, 29000), 300, 1000),
        (2, 0, 0, 0, 2, 16, (31000, 31200, 31500, 32500, 33000, 58000, 58500, 59500, 60000), 500, 1000),
        (2, 0, 1, 1, 1 | 4, 11, (31400, 31400, 31500, 32000, 33000, 59000, 59000, 59000, 61000), 700, 1000),
    ])
    doc = exp.timeline.summarize(recs)
    assert (doc["ctas"], doc["layers"], doc["sms"]) == (4, 2, 2)
    main, beside = doc["kinds"]["main"], doc["kinds"]["beside"]
    assert main["ctas_per_layer"] == beside["ctas_per_layer"] == 1
    assert main["issue"]["median"] == 0.2 and main["wait"]["median"] == 0.3 and main["q"]["median"] == 1.0
    assert main["first_tile"]["median"] == 0.5 and main["tail"]["median"] == 2.0
    assert (main["publish"]["median"], main["siblings"]["median"], main["merge"]["median"]) == (0.5, 1.0, 0.5)
    assert beside["publish"]["max"] == beside["siblings"]["max"] == 0 and beside["merge"]["median"] == 5.5
    assert main["loop"]["median"] == 25.0 and main["loop_waiting_share"]["median"] == 0.3
    assert beside["start_skew"]["max"] == 0.4 and main["end_skew"]["max"] == 1.0
    assert doc["last"]["kind_beside"] == 1 and doc["last"]["wait"]["median"] == 0.2  # layer 1: the cluster CTA, 2: beside
    assert doc["layer_span_us"]["median"] == 29.5 and doc["layer_period_us"]["median"] == 30.0
    # layer 1 ends at 30000 (its cluster CTA); layer 2 starts at 31000 and its cluster CTA is past its wait at 31500
    assert doc["layer_gap_us"]["median"] == 1.0 and doc["layer_release_us"]["median"] == 1.5


def test_the_clock_diagnostic_is_compiled_only_when_asked_for():
    from harness.kernels import nvrtc

    instance = fused_mla_cuda.Instance(8, 3, 8).name
    for define, present in (("", False), ("#define DIAG_CLOCK 1\n", True)):
        cubin = nvrtc.build(define + exp.fused_mla_cuda.SOURCE_TEXT, [instance], "90", fused_mla_cuda.OPTIONS).cubin
        assert (b"diag_clock" in cubin and b"diag_count" in cubin) == present, define or "the committed kernel"


def test_timeline_names_a_kernel_built_without_the_clock(monkeypatch):
    """A module without diag_clock (CUDA_ERROR_NOT_FOUND from cuModuleGetGlobal) is one error that says why; a driver
    call that succeeds raises nothing (its twin)."""
    import torch.cuda._utils as cuda_utils

    class Driver:
        def __init__(self, err):
            self.err = err

        def cuModuleGetGlobal_v2(self, *args):
            return self.err

    kernel = type("Kernel", (), {"module": None})()
    monkeypatch.setattr(cuda_utils, "_get_gpu_runtime_library", lambda: Driver(500))
    with pytest.raises(RuntimeError, match="cuModuleGetGlobal_v2 failed with CUDA error 500 for diag_clock: was the kernel "
                                           "built with DIAG_CLOCK=1"):
        exp.timeline._global(kernel, "diag_clock")
    monkeypatch.setattr(cuda_utils, "_get_gpu_runtime_library", lambda: Driver(0))
    assert exp.timeline._global(kernel, "diag_clock").value == 0
