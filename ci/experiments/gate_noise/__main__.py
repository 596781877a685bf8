import sys

from ci.experiments.gate_noise.gate_noise import main

sys.exit(main())
