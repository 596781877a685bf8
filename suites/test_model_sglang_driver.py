"""The SGLang TPOT driver's own parts on CPU without SGLang: config folder, one-rank overrides,
command line, latency parsing (the engine itself: suites/sglang/test_sglang_driver.py)."""

import json
import os
import stat
import sys

import pytest

from harness.errors import HarnessError
from harness.tpot import sglang_driver
from harness.tpot.config import load_shape


def test_config_folder_and_one_rank_overrides(tmp_path):
    shape = load_shape("glm5-tp8")
    folder = sglang_driver.write_model_folder(shape, tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["GlmMoeDsaForCausalLM"] and cfg["num_hidden_layers"] == 78
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128] and cfg["vocab_size"] == 154880
    assert sglang_driver.one_rank_overrides(shape) == {"num_attention_heads": 8, "num_key_value_heads": 8,
                                                        "moe_intermediate_size": 256, "intermediate_size": 1536, "vocab_size": 19360}
    args = sglang_driver.one_batch_args(folder, shape, 32, 4096, 16, tmp_path / "r.jsonl")
    pairs = dict(zip(args[::1], args[1::1]))
    assert pairs["--load-format"] == "dummy" and pairs["--kv-cache-dtype"] == "fp8_e4m3" and pairs["--attention-backend"] == "flashinfer"
    assert json.loads(pairs["--json-model-override-args"])["num_attention_heads"] == 8 and pairs["--tp-size"] == "1"


def test_decode_latency_from_result_file_then_log(tmp_path):
    result = tmp_path / "r.jsonl"
    result.write_text(json.dumps({"median_decode_latency": 0.0125}) + "\n")
    assert sglang_driver.parse_decode_ms(result, "") == pytest.approx(12.5)
    log = "Decode 0. latency: 0.02 s\nDecode.  median latency: 0.01530 s, median throughput:     65.36 token/s\n"
    assert sglang_driver.parse_decode_ms(tmp_path / "missing.jsonl", log) == pytest.approx(15.3)
    with pytest.raises(HarnessError):
        sglang_driver.parse_decode_ms(tmp_path / "missing.jsonl", "Prefill. latency: 0.5 s")


def _fake_python(tmp_path, body: str):
    """A stand-in interpreter for the plumbing test: it only prints what one_batch would."""
    exe = tmp_path / "fake-python"
    exe.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def test_driver_runs_the_launcher_and_reads_its_latency(tmp_path):
    python = _fake_python(tmp_path, "print(' '.join(sys.argv[1:5]))\nprint('Decode.  median latency: 0.02000 s')")
    out = sglang_driver.run(load_shape("deepseek-v3-tp8"), "gather_cast", 1, 4096, 8, tmp_path, python=python)
    assert out["tpot_ms"] == pytest.approx(20.0)
    assert out["command"][1:5] == ["-m", "harness.tpot.sglang_launch", "--strategy", "gather_cast"]
    assert "-m harness.tpot.sglang_launch --strategy" in out["log_tail"]


def test_driver_failure_is_one_error_naming_the_engine(tmp_path):
    python = _fake_python(tmp_path, "print('RuntimeError: no CUDA GPU'); sys.exit(3)")
    with pytest.raises(HarnessError) as err:
        sglang_driver.run(load_shape("glm5-tp8"), "stock", 1, 4096, 8, tmp_path, python=python)
    assert "sglang one_batch" in str(err.value) and "exit 3" in str(err.value)


def test_cli_engine_sglang_rejects_strategies_it_cannot_install(tmp_path, capsys):
    from harness.cli import main

    python = _fake_python(tmp_path, "print('Decode.  median latency: 0.03 s')")
    out = tmp_path / "r.json"
    assert main(["tpot", "--device", "cpu", "--engine", "sglang", "--sglang-python", python, "--sglang-workdir", str(tmp_path / "w"),
                 "--strategy", "gather_cast", "--strategy", "shadow", "--json", str(out)]) == 0
    rows = {r["strategy"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["gather_cast"]["value"] == pytest.approx(30.0) and rows["shadow"]["value"] is None
    assert "unsupported" in rows["shadow"]["detail"] and os.path.exists(tmp_path / "w" / "model" / "config.json")
