"""python -m ci.experiments.fused_variants: see fused_variants.py."""
import sys

from ci.experiments.fused_variants.fused_variants import main

sys.exit(main())
