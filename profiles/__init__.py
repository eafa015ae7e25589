"""Per-user profile directories: settings, versioned head artifacts, conversation history.

Public API (imports nothing heavy; never torch):
    Profile.open(name=None, create=True) -> Profile   (.name .path .config .heads .history)
    Profile.list() -> list[str]
    ProfileConfig, HeadStore, HistoryStore, Conversation, Message, ProfileError
See profiles/profile.py, config.py, heads.py, history.py for each contract.
"""
from profiles.config import ProfileConfig, parse_size
from profiles.errors import ProfileError
from profiles.heads import HeadStore
from profiles.history import Conversation, HistoryStore, Message
from profiles.profile import Profile

__all__ = ["Conversation", "HeadStore", "HistoryStore", "Message", "Profile", "ProfileConfig", "ProfileError",
           "parse_size"]
