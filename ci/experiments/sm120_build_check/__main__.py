from ci.experiments.sm120_build_check.sm120_build_check import main

main()
