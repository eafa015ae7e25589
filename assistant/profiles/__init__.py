"""Per-user profile directories: settings, versioned head artifacts, conversation history.

Public API (imports nothing heavy; never torch):
    Profile.open(name=None, create=True) -> Profile   (.name .path .config .heads .history)
    Profile.list() -> list[str]
    ProfileConfig, HeadStore, HistoryStore, ProfileError
    Conversation, Message (the data model of assistant.types, what HistoryStore returns)
See assistant/profiles/profile.py, config.py, heads.py, history.py for each contract.
"""
from assistant.profiles.config import ProfileConfig, parse_size
from assistant.profiles.errors import ProfileError
from assistant.profiles.heads import HeadStore
from assistant.profiles.history import HistoryStore
from assistant.profiles.profile import Profile
from assistant.types import Conversation, Message

__all__ = ["Conversation", "HeadStore", "HistoryStore", "Message", "Profile", "ProfileConfig", "ProfileError",
           "parse_size"]
