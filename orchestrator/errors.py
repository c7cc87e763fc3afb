"""User-facing errors: anything raised as `UserError` (or one of the engine's input errors)
is printed by the CLI as one line `spectune: error: ...` and exits 2, without a traceback."""

from __future__ import annotations

from workers.errors import BackendError
from workers.model.args import CheckpointError, ModelConfigError


class UserError(ValueError):
    """Bad input from the user: a flag, a YAML field, a file. The message names it."""


# errors the engine raises for bad input; the CLI treats them like UserError
INPUT_ERRORS = (UserError, CheckpointError, ModelConfigError, BackendError)


# two drivers on one study write the same rows at once (the schema, an MLflow tag or latest metric):
# the loser of such a race sees one of these and only has to try again
WRITE_RACE = ("already exists", "UNIQUE constraint", "duplicate key", "IntegrityError")


def is_write_race(e: BaseException) -> bool:
    return any(m in f"{type(e).__name__} {e}" for m in WRITE_RACE)
