import sys

from ci.experiments.independent_timing.independent_timing import main

if len(sys.argv) != 2:
    sys.exit("usage: python -m ci.experiments.independent_timing OUT.json")
main(sys.argv[1])
