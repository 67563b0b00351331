"""Model architectures (presets and local directories), tokenizers and FLOPs counts."""
