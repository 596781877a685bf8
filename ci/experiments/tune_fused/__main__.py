import sys

from ci.experiments.tune_fused.tune_fused import main

sys.exit(main())
