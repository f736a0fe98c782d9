"""What a compiled program costs: memory, loop-aware FLOPs and collectives, and whether it fits HBM."""
