"""The ``corral`` command: dispatches to the server, the worker, or the HTTP-only CLI.

The server and the worker are imported only when their command runs, so the CLI (a thin HTTP
client) starts fast and never loads the store or the core.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    if command == "server":
        from corral.server.main import main as server_main

        return server_main(argv[1:])
    if command == "worker":
        from corral.worker.main import main as worker_main

        return worker_main(argv[1:])
    from corral.cli.main import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
