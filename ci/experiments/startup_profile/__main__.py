import sys

from ci.experiments.startup_profile.startup_profile import main

sys.exit(main())
