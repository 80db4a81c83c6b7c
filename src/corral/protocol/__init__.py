"""The wire contract shared by the server, the worker, the CLI and the SDK."""
