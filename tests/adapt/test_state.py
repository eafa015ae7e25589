"""assistant.adapt.state: copying a profile with its adapter state reset (no torch)."""
from __future__ import annotations

from assistant.adapt.state import CYCLE_KEY, REPLAY_FILE, STATE_FILE, adapter_dir, copy_reset
from assistant.profiles.heads import HeadStore
from tests.profiles.profile_helpers import make_artifact


def test_copy_reset_keeps_the_installed_base_head_and_drops_the_adapters(tmp_path):
    src = tmp_path / "src"
    (src / "heads").mkdir(parents=True)
    (src / "profile.toml").write_text('target = "default"\n')
    store = HeadStore(src / "heads")
    slices = tmp_path / "base.slices.jsonl"
    slices.write_text('{"prompt": "anchor"}\n')
    base = store.publish(make_artifact(tmp_path / "base.safetensors", seed=1), {"note": "installed"},
                         companions={"head.slices.jsonl": slices})
    store.publish(make_artifact(tmp_path / "c1.safetensors", seed=2), {CYCLE_KEY: 1})
    adapter_dir(src).mkdir()
    for name in (STATE_FILE, REPLAY_FILE):
        (adapter_dir(src) / name).write_text("x")

    copy_reset(src, tmp_path / "dst")

    dst = HeadStore(tmp_path / "dst" / "heads")
    assert len(dst.versions()) == 1
    kept = dst.current()
    assert kept.read_bytes() == store.path_of(base).read_bytes()
    assert dst.meta(dst.versions()[0])["note"] == "installed"
    assert (kept.parent / "head.slices.jsonl").read_text() == '{"prompt": "anchor"}\n'
    assert not (adapter_dir(tmp_path / "dst") / STATE_FILE).exists()
    assert not (adapter_dir(tmp_path / "dst") / REPLAY_FILE).exists()
    assert (tmp_path / "dst" / "profile.toml").exists()


def test_copy_reset_of_a_profile_on_the_shipped_head_has_no_versions(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "profile.toml").write_text("")
    copy_reset(src, tmp_path / "dst")
    assert not (tmp_path / "dst" / "heads").exists()
