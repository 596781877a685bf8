"""Running strategies on a case: the prepared case and the decode session (per step, per layer)."""
