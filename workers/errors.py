"""Errors a gang raises: `GangError` for the driver (a rank raised, died or missed its deadline) and
`WorkerError` inside a worker for a problem of the trial (bad backend, wrong sums, ...)."""


class GangError(RuntimeError):
    """The gang failed: a worker raised, died or missed its deadline. The message names the rank."""


class WorkerError(RuntimeError):
    """Raised inside a worker for a problem of the trial (bad backend, wrong sums, ...)."""


class BackendError(ValueError):
    """An allreduce backend that does not exist or cannot run on the gang (one line): bad input,
    defined here (no torch) so the CLI can name it without importing the backends."""
