"""profile.toml: defaults, round trip, validation errors that name the file and the key."""
from __future__ import annotations

import pytest
from tests.profiles.profile_helpers import use_home

from assistant.profiles import Profile, ProfileConfig, ProfileError
from assistant.profiles.config import load_config, parse_size, save_config


@pytest.fixture
def home(tmp_path, monkeypatch):
    return use_home(tmp_path, monkeypatch)


def test_open_creates_default_profile(home):
    p = Profile.open()
    assert p.name == "default"
    assert p.path == home / "profiles" / "default"
    assert (p.path / "profile.toml").is_file()
    assert p.config == ProfileConfig()
    assert Profile.list() == ["default"]


def test_env_profile_and_names(home, monkeypatch):
    monkeypatch.setenv("ASSISTANT_PROFILE", "work")
    assert Profile.open().name == "work"
    for bad in ("../x", "a/b", ".hidden", "-x", "x" * 65):
        with pytest.raises(ProfileError):
            Profile.open(bad)


def test_open_missing_without_create(home):
    with pytest.raises(ProfileError, match="no profile named 'nope'"):
        Profile.open("nope", create=False)


def test_round_trip_and_update(home):
    p = Profile.open("a")
    cfg = p.update_config(target="/models/x", dtype="int8", memory_budget="8GiB", tree_width=32,
                          system_prompt='Say "hi"\nthen\tstop \\ ok', adapter_enabled=False, adapter_interval_s=12.5,
                          history_lookup=False, history_tokens=5000)
    again = Profile.open("a").config
    assert again == cfg
    assert again.memory_budget_bytes == 8 * 2**30
    with pytest.raises(ProfileError, match="dtype"):
        p.update_config(dtype="fp8")
    assert Profile.open("a").config == cfg  # a rejected change writes nothing


@pytest.mark.parametrize("text, key", [
    ("dtype = \"fp8\"\n", "dtype"),
    ("tree_width = 0\n", "tree_width"),
    ("tree_width = \"16\"\n", "tree_width"),
    ("memory_budget = \"lots\"\n", "memory_budget"),
    ("colour = \"red\"\n", "colour"),
    ("[adapter]\nenabled = \"yes\"\n", "adapter.enabled"),
    ("[adapter]\nspeed = 1\n", "adapter.speed"),
    ("history_lookup = 1\n", "history_lookup"),
    ("history_tokens = -5\n", "history_tokens"),
])
def test_bad_values_name_key_and_file(home, text, key):
    p = Profile.open("x")
    cfg_file = p.path / "profile.toml"
    cfg_file.write_text(text)
    with pytest.raises(ProfileError) as e:
        Profile.open("x")
    msg = str(e.value)
    assert "\n" not in msg and str(cfg_file) in msg and f"'{key}'" in msg


def test_malformed_toml_one_line_error_and_nothing_lost(home):
    p = Profile.open("x")
    h = p.history
    conv = h.new_conversation("kept")
    h.add_message(conv, "user", "hello")
    p.close()
    cfg_file = p.path / "profile.toml"
    cfg_file.write_text("target = \"default\"\ndtype = \n[adapter\n")
    before = cfg_file.read_bytes()
    with pytest.raises(ProfileError) as e:
        Profile.open("x")
    msg = str(e.value)
    assert "\n" not in msg and str(cfg_file) in msg and "TOML" in msg
    assert cfg_file.read_bytes() == before          # never rewritten by opening
    lenient = Profile.open("x", strict=False)        # everything else still works
    assert lenient.config == ProfileConfig() and lenient.problems == [msg]
    assert [m.content for m in lenient.history.messages(conv)] == ["hello"]
    lenient.close()


def test_not_utf8(home, tmp_path):
    f = tmp_path / "profile.toml"
    f.write_bytes(b"target = \"\xff\"\n")
    with pytest.raises(ProfileError, match="UTF-8"):
        load_config(f)


def test_save_is_atomic_no_temp_left(tmp_path):
    f = tmp_path / "profile.toml"
    save_config(f, ProfileConfig(tree_width=8))
    save_config(f, ProfileConfig(tree_width=9))
    assert load_config(f).tree_width == 9
    assert [x.name for x in tmp_path.iterdir()] == ["profile.toml"]


def test_parse_size():
    assert parse_size("8GiB") == 8 * 2**30
    assert parse_size("512 MiB") == 512 * 2**20
    assert parse_size("6GB") == 6 * 10**9
    with pytest.raises(ValueError):
        parse_size("eight")
