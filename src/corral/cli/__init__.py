"""The ``corral`` command-line interface: a thin HTTP client of the API (``shared/API.md``).

Every command but ``up`` is one call (or a short poll) through ``corral.client.Client``; nothing here
reads the store or runs scheduling code, so the CLI behaves exactly like any other client and works
against a remote server. ``corral.cli.main`` holds the parser and the documented exit codes.
"""
