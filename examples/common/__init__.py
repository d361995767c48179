"""What the trained examples share: the GRPO run on a CPU and the held-out comparison with intervals."""
