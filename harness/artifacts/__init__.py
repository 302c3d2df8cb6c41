"""Artifacts: a profile's pinned model, resolved to a local MLX directory (hub, wheels, conversions, twins)."""
