"""HTTP routes, one module per area of ``shared/API.md``."""
