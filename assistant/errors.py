"""Which exceptions are a user's to fix (printed as one line) rather than bugs (traceback)."""
from __future__ import annotations


class UserError(Exception):
    """An error whose message is the whole story for the user."""


def is_user_error(e: BaseException) -> bool:
    names = {"UserError", "ModelFetchError", "ProfileError", "BudgetError", "ContextFullError",
             "JSONLError", "ArtifactError", "AdapterBusy"}
    return any(c.__name__ in names for c in type(e).__mro__) or isinstance(
        e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError))


def one_line(e: BaseException) -> str:
    """The message a user sees: a file error names the file and the reason, others their first line."""
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or e}"
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
