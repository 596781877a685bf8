"""python -m ci.experiments.fused_runs: see fused_runs.py."""
import sys

from ci.experiments.fused_runs.fused_runs import main

sys.exit(main())
