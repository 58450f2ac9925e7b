"""The one exception type this package raises for problems a user can fix."""


class HvdDcasgdError(RuntimeError):
    """A launch, configuration or input problem, explained in one sentence.

    ``collective`` is True when every rank raises the same error together (a
    launch whose ranks disagree): they can all exit without aborting the job.
    """

    def __init__(self, message: str, collective: bool = False):
        super().__init__(message)
        self.collective = collective
