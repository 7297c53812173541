"""The exception types that the CLI turns into a one-line message and a non-zero exit (and the
service into a 4xx JSON error)."""


class UserError(Exception):
    """Bad input or environment the user can fix: shown as one line, no traceback."""


class TooLargeError(UserError):
    """The input is well formed but asks for more than a limit allows: HTTP 413."""


class BusyError(UserError):
    """The operation conflicts with one already running (e.g. a second retrain): HTTP 409."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (libraries' messages run to paragraphs), or its
    type's name when it has none: what a one-line error quotes of its cause."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
