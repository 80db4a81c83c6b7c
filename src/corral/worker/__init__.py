"""The worker agent: registers a host's resources, claims jobs, runs them, reports their outcome.

It speaks to the server only over HTTP, through its own client (``corral.worker.calls.WorkerClient``,
not the user-facing SDK); it never imports the store, the server or the core (an import-linter
contract says so).
"""
