"""What this package raises and warns for problems a user can fix.

Every error is an :class:`HvdDcasgdError` with a message of one sentence or
two; :class:`HvdDcasgdValueError` is the one for a bad argument or setting (it
is also a ``ValueError``, as those raises always were).  What the user's
own code should change is a warning, through :func:`warn` with the category
:class:`HvdDcasgdWarning` and attributed to the script's line, so a script can
filter it with the standard ``warnings`` machinery; everything else the
package has to say (a stall, a fallback, progress) is a log record of
``logging.getLogger("hvd_dcasgd")`` (:mod:`.log`).
"""

import warnings


class HvdDcasgdError(RuntimeError):
    """A launch, configuration or input problem, explained in one sentence.

    ``collective`` is True when every rank raises the same error together (a
    launch whose ranks disagree): they can all exit without aborting the job.
    Of those ranks, the one that ``speaks`` says the sentence (once per job,
    not once per rank); the others exit with it silently.
    """

    def __init__(self, message: str, collective: bool = False, speaks: bool = True):
        super().__init__(message)
        self.collective = collective
        self.speaks = speaks


class HvdDcasgdValueError(HvdDcasgdError, ValueError):
    """A bad argument or setting value."""


class HvdDcasgdWarning(UserWarning):
    """Something works, but not the way the user probably wants."""


def warn(message: str, stacklevel: int = 3) -> None:
    """Warn with :class:`HvdDcasgdWarning`, attributed to the caller's caller
    (``stacklevel``): the line of the script that asked for what is warned of."""
    warnings.warn(f"hvd_dcasgd: {message}", HvdDcasgdWarning, stacklevel=stacklevel)
