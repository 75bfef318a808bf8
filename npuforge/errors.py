"""The one exception family for user-facing failures.

Every message is a single line that names the file, node, op or option at fault
and says what to do. The CLI prints it as ``npuforge: error: ...`` and exits 2.
"""


class NpuforgeError(Exception):
    """A failure the user can act on (bad file, unsupported op, wrong input...)."""


class ModelFormatError(NpuforgeError):
    """A model file that cannot be read: corrupt, truncated, missing data."""


class UnsupportedError(NpuforgeError):
    """An op, attribute value, dtype or opset outside what npuforge covers."""


class ShapeError(NpuforgeError):
    """Shapes that disagree with an op's shape rule, or a wrong input shape."""


class CheckError(NpuforgeError):
    """The IR checker found problems; ``problems`` lists each one."""

    def __init__(self, problems):
        self.problems = list(problems)
        head = self.problems[0] if self.problems else "graph check failed"
        more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        super().__init__(head + more)
