"""Which exceptions are a user's to fix (printed as one line) rather than bugs (traceback)."""
from __future__ import annotations


class UserError(Exception):
    """An error whose message is the whole story for the user."""


def is_user_error(e: BaseException) -> bool:
    names = {"UserError", "ModelFetchError", "ProfileError", "BudgetError", "ContextFullError",
             "JSONLError", "ArtifactError"}
    return any(c.__name__ in names for c in type(e).__mro__) or isinstance(e, (FileNotFoundError, PermissionError))
