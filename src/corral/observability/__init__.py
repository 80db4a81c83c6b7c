"""Metrics and structured logs: every metric declared once, every log line a JSON object."""
