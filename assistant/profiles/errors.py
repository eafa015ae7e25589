"""The one exception type of the profiles package.

Contract: every failure a user can act on (a damaged file, a bad key, a missing
profile) raises `ProfileError` whose message is ONE line that starts with or
names the file concerned. assistant.errors treats it as a user error.
"""
from __future__ import annotations


class ProfileError(Exception):
    """A profile file is missing, malformed or damaged (one-line message naming the file)."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))  # always one line
