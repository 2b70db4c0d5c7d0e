"""The one exception type the command line turns into a clear message and a non-zero exit."""


class CmtError(Exception):
    """A user-facing failure: bad input, missing GPU, unwritable path. Never a traceback."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code
