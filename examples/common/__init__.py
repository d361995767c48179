"""What the examples share: the GRPO run on a CPU, the held-out comparison with intervals, the rules rewards share
(format credit, negations and hedges), a batch of rollouts through a store (for algorithms written in the
examples), and the start-up checks of the variables and services a command needs (exit code 2 when one is
missing)."""
