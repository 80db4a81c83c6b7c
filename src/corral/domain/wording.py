"""How a reason reads for people, in one place: ``corral jobs``, ``show``, ``why``, ``events`` and
the dashboard all word a reason by ``worded_reason`` (issue 23: they disagreed). Imports nothing,
so the CLI reads it at no start-up cost."""


def worded_reason(code: str, message: str) -> str:
    """``code: message``: the stable code first (what scripts and searches match), then the words."""
    return f"{code}: {message}"
