"""corral: a job scheduler for GPU clusters."""

__version__ = "0.1.0"
