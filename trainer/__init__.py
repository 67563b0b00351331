"""The bundled GRPO trainer: usable on its own, without pytest."""
