"""The exception types that the CLI turns into a one-line message and a non-zero exit (and the
service into a 4xx JSON error)."""


class UserError(Exception):
    """Bad input or environment the user can fix: shown as one line, no traceback."""


class BusyError(UserError):
    """The operation conflicts with one already running (e.g. a second retrain): HTTP 409."""
