"""Issue 28's production runs of fused_fp8, and its "Done when" lines judged from them."""
