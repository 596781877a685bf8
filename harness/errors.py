"""The one error type the CLI turns into a single line and exit code 2."""


class HarnessError(Exception):
    """Bad input or an impossible request: `where` names the file/field at fault."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


class CheckFailed(Exception):
    """A correctness check failed (CLI exit code 1)."""
