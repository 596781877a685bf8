"""The inputs built from a spec: the case, the paged FP8 pool, the memory plan, the float64 reference, exported inputs."""
