"""Errors that the CLIs turn into one line and exit code 2."""


class SpecdecError(Exception):
    """A problem with the user's input or environment, reported as one line.

    Anything raised as SpecdecError is an expected failure: the CLI prints
    ``specdec-compile: error: <message>`` and exits with ``exit_code``.
    Every other exception is a bug.
    """

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class DetectionError(SpecdecError):
    """The graph is not a decoder LM this compiler understands."""


class UnsupportedPatternError(SpecdecError):
    """The graph is a decoder LM, but uses a pattern no pass can rewrite."""
