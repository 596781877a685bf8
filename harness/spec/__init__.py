"""What is run: model presets, scenarios, the step schedule, the counter-hash input values, CUDA-graph buckets, the planted faults, how a GPU is named."""
