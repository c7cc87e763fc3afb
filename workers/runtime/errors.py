"""Errors a gang raises: `GangError` for the driver (a rank raised, died or missed its deadline) and
`WorkerError` inside a worker for a problem of the trial (bad backend, wrong sums, ...)."""


class GangError(RuntimeError):
    """The gang failed: a worker raised, died or missed its deadline. The message names the rank."""


class WorkerError(RuntimeError):
    """Raised inside a worker for a problem of the trial (bad backend, wrong sums, ...)."""
