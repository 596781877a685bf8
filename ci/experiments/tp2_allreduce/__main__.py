import sys

from ci.experiments.tp2_allreduce.tp2_allreduce import main

sys.exit(main())
