import sys

from ci.experiments.ncu_fused.ncu_fused import main

sys.exit(main())
