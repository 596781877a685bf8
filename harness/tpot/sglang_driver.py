"""`harness tpot --engine sglang`: SGLang's one-batch benchmark on a config-only model folder, with
the strategy installed into SGLang (harness/tpot/sglang_plugin.py), every decode step's latency (its
`--log-decode-step 1` log lines) parsed into the results JSON as samples, so `compare` can gate them.
Needs SGLang on a GPU box; this driver has not run on a GPU here.

The folder holds only config.json (weights are SGLang's `--load-format dummy`), FP8 block-quantized
as the real checkpoints. `one_rank` shrinks the model to one TP rank through
`--json-model-override-args` (heads, FFN/MoE intermediates and vocab divided by tp) and runs tp 1.

The KV pool is the case's: SGLang sizes it from free GPU memory unless `--max-total-tokens` caps it
(sglang 0.5.23 KVCacheConfigurator._apply_token_constraints: min(profiled, cap), then rounded down to
whole pages), and stock's cost is a cast of the whole layer buffer, so the driver passes the case's
slots and refuses (one HarnessError) a run whose pool SGLang reports otherwise.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

from harness.errors import HarnessError
from harness.fsio import check_new_dir, check_writable, write_text
from harness.inputs.pool import PoolGeometry, geometry_for
from harness.tpot.config import ModelShape
from harness.tpot.sglang_launch import POOL_MARK

# GLM-5's DSA indexer fields: assumed (DeepSeek-V3.2's values), not read from GLM-5's own config
DSA_INDEXER = {"index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048}
# A DSA model's pool rows are raw 576-byte FP8 rows only with the trtllm DSA backends (sglang 0.5.23
# calculate_mla_kv_cache_dim; its defaults, flashmla_kv on SM90 and flashinfer_sparse_mla for GLM-5 on
# SM12x, store 656-byte rows with block scales): the deployment the harness models (docs/correctness.md#scope)
DSA_RAW_ROWS = ["--dsa-prefill-backend", "trtllm", "--dsa-decode-backend", "trtllm"]
DECODE_LINE = re.compile(r"Decode\.\s+median latency:\s*([0-9.eE+-]+)\s*s")
# sglang 0.5.23 one_batch.latency_test_run_once, per step with --log-decode-step 1; its warmup run logs
# steps 0-4 before the "Benchmark ..." line, so only the lines after the last one are the measured run's
BENCHMARK_LINE = "Benchmark ..."
STEP_LINE = re.compile(r"^Decode (\d+)\. Batch size: (\d+), latency: ([0-9.eE+-]+) s", re.MULTILINE)
# the pool SGLang built: the launcher's report of its pool object (tp 1), and one_batch.load_model's own line (rank 0)
POOL_LINE = re.compile(r"^" + re.escape(POOL_MARK) + r"(\{.*\})\s*$", re.MULTILINE)
SGLANG_POOL_LINE = re.compile(r"^max_total_num_tokens=(\d+)\s*$", re.MULTILINE)


def model_config(shape: ModelShape) -> dict:
    """config.json of the full model (as the public checkpoint describes it)."""
    arch, model_type = shape.architecture, shape.model_type  # models.toml: what SGLang serves it as
    cfg = {
        "architectures": [arch], "model_type": model_type, "torch_dtype": "bfloat16",
        "hidden_size": shape.hidden_size, "num_hidden_layers": shape.num_layers, "first_k_dense_replace": shape.first_k_dense,
        "num_attention_heads": shape.num_heads, "num_key_value_heads": shape.num_heads,
        "q_lora_rank": shape.q_lora_rank, "kv_lora_rank": shape.kv_lora_rank,
        "qk_nope_head_dim": shape.qk_nope_head_dim, "qk_rope_head_dim": shape.qk_rope_head_dim, "v_head_dim": shape.v_head_dim,
        "n_routed_experts": shape.n_routed_experts, "num_experts_per_tok": shape.num_experts_per_tok,
        "n_shared_experts": shape.n_shared_experts, "moe_intermediate_size": shape.moe_intermediate_size,
        "intermediate_size": shape.intermediate_size, "vocab_size": shape.vocab_size,
        "n_group": shape.n_group, "topk_group": shape.topk_group, "routed_scaling_factor": shape.routed_scaling_factor,
        "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 163840, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    }
    if model_type == "glm_moe_dsa":
        cfg.update(DSA_INDEXER)
    return cfg


def one_rank_overrides(shape: ModelShape) -> dict:
    """Fields that make a tp-1 model the size of one rank of the tp-`shape.tp` deployment."""
    return {"num_attention_heads": shape.heads, "num_key_value_heads": shape.heads,
            "moe_intermediate_size": shape.moe_inter, "intermediate_size": shape.dense_inter, "vocab_size": shape.vocab}


WORKDIR_MARK = ".mla-harness-sglang-workdir"  # in a --sglang-workdir the driver made: its files there are its own


def check_workdir(workdir: Path) -> None:
    """Before any work: --sglang-workdir is new, empty or one the driver made (its mark), so the result files it
    replaces are never a user's (`run` marks it; its model config goes to a fresh path: write_model_folder)."""
    check_new_dir(workdir, "--sglang-workdir")
    if workdir.is_dir() and any(workdir.iterdir()) and not (workdir / WORKDIR_MARK).is_file():
        raise HarnessError("--sglang-workdir", f"{workdir} holds files the harness did not write; they are kept "
                           "(choose a new or empty folder)")


def write_model_folder(shape: ModelShape, parent: Path) -> Path:
    """The folder SGLang loads the model from: `parent`/model-<its config.json's sha256>, so no config.json on disk is
    ever replaced: one of this content is used as it is; one of other content (not this run's) is kept and the run
    refused, one line naming it."""
    text = json.dumps(model_config(shape), indent=1) + "\n"
    folder = parent / f"model-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    path = folder / "config.json"
    if path.is_file():
        if path.read_text() != text:
            raise HarnessError("--sglang-workdir", f"{path} exists and is not this run's model config; it is kept "
                                                   "(choose a new or empty --sglang-workdir)")
        return folder
    check_writable(path, "--sglang-workdir")
    write_text(path, text, "--sglang-workdir")
    return folder


def one_batch_args(folder: Path, shape: ModelShape, batch_size: int, input_len: int, output_len: int,
                   result_file: Path, slots: int, one_rank: bool = True) -> list[str]:
    """Arguments of `python -m sglang.benchmark.one_batch` (sglang 0.5.23's bench_one_batch); `slots` the pool's
    token slots (`--max-total-tokens`: SGLang's pool `size`, whose layer buffers have size + page_size rows)."""
    args = ["--model-path", str(folder), "--load-format", "dummy", "--kv-cache-dtype", "fp8_e4m3",
            "--attention-backend", "flashinfer", "--skip-tokenizer-init", "--trust-remote-code",
            "--batch-size", str(batch_size), "--input-len", str(input_len), "--output-len", str(output_len),
            "--result-filename", str(result_file), "--log-decode-step", "1", "--max-total-tokens", str(slots)]
    if shape.preset.index_k_bytes:  # a DSA model
        args += DSA_RAW_ROWS
    if one_rank:
        args += ["--tp-size", "1", "--json-model-override-args", json.dumps(one_rank_overrides(shape))]
    else:
        args += ["--tp-size", str(shape.tp)]
    return args


def launch_command(python: str, strategy: str, args: list[str], slots: int) -> list[str]:
    return [python, "-m", "harness.tpot.sglang_launch", "--strategy", strategy, "--slots", str(slots), "--", *args]


def check_slots(slots: int, page_size: int, batch_size: int, input_len: int, output_len: int) -> None:
    """Before SGLang runs: a pool it would build otherwise than asked. It rounds --max-total-tokens down to whole pages
    (pool_configurator.py DefaultPoolConfigurator.calculate_pool_sizes_from_max_tokens), and one_batch skips a batch
    of more than max_total_num_tokens // (input_len + output_len) requests (latency_test_run_once)."""
    if slots % page_size:
        raise HarnessError("--slots", f"{slots:,} slots are not whole {page_size}-token pages: SGLang would round its pool "
                                      f"down to {slots // page_size * page_size:,} (choose a multiple of {page_size})")
    need = batch_size * (input_len + output_len)
    if need > slots:
        raise HarnessError("--slots", f"SGLang's one_batch needs batch x (input_len + output_len) = {batch_size} x "
                                      f"({input_len} + {output_len}) = {need:,} slots and skips the run on a {slots:,}-slot pool")


def check_pool(log: str, geometry: PoolGeometry) -> dict:
    """The pool SGLang ran, which must be the case's: the launcher's report of SGLang's pool object (slots, rows and
    row bytes of a layer buffer: what stock casts) and SGLang's own `max_total_num_tokens=` line (all that tp > 1
    leaves, its workers being spawned without the launcher's hook). Returns the report (or the line's slots)."""
    want = {"slots": geometry.slots, "rows": geometry.rows, "row_bytes": geometry.row_width}
    reports = []
    for text in POOL_LINE.findall(log):
        try:
            reports.append(json.loads(text))
        except json.JSONDecodeError:
            raise HarnessError("sglang one_batch", f"unreadable pool report {text[:120]!r}") from None
    reports += [{"slots": int(n)} for n in SGLANG_POOL_LINE.findall(log)]
    if not reports:
        raise HarnessError("sglang one_batch", f"its log names no KV pool size (no {POOL_MARK.strip()!r} or max_total_num_tokens= "
                                               f"line): whether it ran the case's {geometry.slots:,}-slot pool is unknown, so its TPOT is not recorded")
    for got in reports:
        if any(got.get(k) is not None and got[k] != v for k, v in want.items()):  # None: a pool without per-layer buffers
            said = ", ".join(f"{k} {got[k]:,}" for k in want if got.get(k) is not None)
            raise HarnessError("sglang one_batch", f"SGLang's KV pool has {said}, not the case's {geometry.slots:,} slots "
                                                   f"({geometry.rows:,} rows of {geometry.row_width} B, {geometry.page_size}-token pages): "
                                                   "its TPOT would be labelled with a pool it did not run (a pool capped by GPU memory: "
                                                   "choose fewer --slots or --layers)")
    return reports[0]


def parse_decode_ms(result_file: Path, stdout: str) -> float:
    """Median decode latency in ms: from the benchmark's result JSONL, else from its log line."""
    if result_file.exists():
        for line in reversed(result_file.read_text().splitlines()):
            try:
                value = json.loads(line).get("median_decode_latency")
            except (json.JSONDecodeError, AttributeError):
                continue
            if value is not None:
                return float(value) * 1e3
    found = DECODE_LINE.findall(stdout)
    if not found:
        raise HarnessError("sglang one_batch", f"no decode latency in {result_file} or the log")
    return float(found[-1]) * 1e3


def parse_step_ms(stdout: str, batch_size: int, output_len: int) -> list[float]:
    """Each measured decode step's latency in ms, in step order: the `Decode i.` lines after the last
    "Benchmark ..." line, which must be steps 0..output_len-2 of `batch_size` requests (SGLang times
    output_len - 1 decode steps and takes their median)."""
    if BENCHMARK_LINE not in stdout:
        raise HarnessError("sglang one_batch", f"no {BENCHMARK_LINE!r} line in its log: not sglang.benchmark.one_batch's output")
    steps = STEP_LINE.findall(stdout.rsplit(BENCHMARK_LINE, 1)[1])
    if [(int(i), int(b)) for i, b, _ in steps] != [(i, batch_size) for i in range(output_len - 1)]:
        raise HarnessError("sglang one_batch", f"its log has {len(steps)} decode step lines, not steps 0..{output_len - 2} of batch "
                                               f"{batch_size} (does this SGLang log every step with --log-decode-step 1?)")
    return [float(seconds) * 1e3 for _, _, seconds in steps]


def run(shape: ModelShape, strategy: str, batch_size: int, input_len: int, output_len: int, workdir: Path, slots: int,
        python: str = sys.executable, one_rank: bool = True, timeout_s: int = 3600) -> dict:
    """Run the benchmark once for `strategy` on a pool of `slots` token slots: {step_ms (every decode step), tpot_ms
    (their median), sglang_median_ms (SGLang's own, unrounded), pool (SGLang's report of it), command, log_tail}."""
    geometry = geometry_for(shape.preset, slots, shape.num_layers)
    check_slots(slots, geometry.page_size, batch_size, input_len, output_len)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / WORKDIR_MARK).touch()
    folder = write_model_folder(shape, workdir)
    result_file = workdir / f"one_batch-{strategy}.jsonl"
    result_file.unlink(missing_ok=True)
    cmd = launch_command(python, strategy, one_batch_args(folder, shape, batch_size, input_len, output_len, result_file, slots, one_rank),
                         slots)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    log = proc.stdout + proc.stderr
    if POOL_LINE.search(proc.stdout) or SGLANG_POOL_LINE.search(proc.stdout) or proc.returncode == 0:
        pool = check_pool(proc.stdout, geometry)  # first: the launcher stops (exit 2) on a pool of another size
    if proc.returncode != 0:
        raise HarnessError("sglang one_batch", f"exit {proc.returncode}: {log.strip().splitlines()[-1] if log.strip() else 'no output'}")
    steps = parse_step_ms(proc.stdout, batch_size, output_len)
    return {"step_ms": steps, "tpot_ms": statistics.median(steps), "sglang_median_ms": parse_decode_ms(result_file, log),
            "pool": pool, "command": cmd, "log_tail": log[-2000:]}
