"""asv benchmarks of the SGLang gate (ci/sglang_gate.py): benchmarks.py."""
