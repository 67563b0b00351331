"""Code that runs inside the Ray training workers: the actor update, FSDP2 and data-parallel plumbing."""
