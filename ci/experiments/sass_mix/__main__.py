"""python -m ci.experiments.sass_mix: see sass_mix.py."""
import sys

from ci.experiments.sass_mix.sass_mix import main

sys.exit(main())
