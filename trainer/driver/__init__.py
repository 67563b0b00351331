"""Code that runs in the driver process: the GRPO loop, its Ray worker group, checkpoints, logging, reward."""
