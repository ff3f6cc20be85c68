"""Training scripts that look like users' jobs, for bench/real_stacks.py (each runs as a plain
``python`` process, so ``trainguard run`` captures it with zero code change)."""
