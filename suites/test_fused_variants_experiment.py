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
    for name in ("SOURCE", "_kernel", "_wave", "_merge_kernel"):
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
    assert all(f"#define {d} 0" in exp.fused_mla_cuda.SOURCE_TEXT for d in ("DIAG_STREAM_ONLY", "DIAG_NO_MERGE"))


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
