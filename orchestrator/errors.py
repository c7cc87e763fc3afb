"""User-facing errors: anything raised as `UserError` (or one of the engine's input errors)
is printed by the CLI as one line `spectune: error: ...` and exits 2, without a traceback."""
from __future__ import annotations

from workers.checkpoint import CheckpointError
from workers.comm import BackendError
from workers.modelargs import ModelConfigError


class UserError(ValueError):
    """Bad input from the user: a flag, a YAML field, a file. The message names it."""


# errors the engine raises for bad input; the CLI treats them like UserError
INPUT_ERRORS = (UserError, CheckpointError, ModelConfigError, BackendError)
