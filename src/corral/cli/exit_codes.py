"""The CLI's documented exit codes (also in ``corral --help``), so scripts can branch on them."""

OK = 0
"""The command did what was asked (``submit --wait``: the job ended ``done``)."""
REFUSED = 1
"""The server refused the request (4xx/5xx, ``corral: <code>: <message>`` printed), or the work failed."""
USAGE = 2
"""Bad flags or arguments (argparse's own code)."""
UNREACHABLE = 3
"""No server answered at ``--server``."""
UNSCHEDULABLE = 4
"""``submit --wait``: the job (or gang, or array) has been ``unschedulable`` (no registered worker
could ever hold it) for ``--unschedulable-after`` seconds: waiting longer would wait for ever."""
INTERRUPTED = 130
"""Ctrl-C while waiting (the shell's convention for SIGINT)."""

EPILOG = """\
exit codes:
  0  success
  1  the server refused the request (the message is printed as `corral: <code>: <message>`),
     or `submit --wait` saw the job end other than done
  2  usage error (bad flags or arguments)
  3  the server is unreachable (start one with `corral up`, or set --server / CORRAL_SERVER)
  4  `submit --wait`: the job has been unschedulable (no registered worker could ever hold it)
     for --unschedulable-after seconds (default 60)
"""
