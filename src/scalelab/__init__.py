"""scalelab: reproducible scaling experiments (precision x ZeRO stage x world size)."""

__version__ = "0.6.0.dev0"
