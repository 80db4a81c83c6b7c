"""The HTTP API, the background loops, and the wiring of core and store."""
