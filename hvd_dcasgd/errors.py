"""The one exception type this package raises for problems a user can fix."""


class HvdDcasgdError(RuntimeError):
    """A launch, configuration or input problem, explained in one sentence."""
