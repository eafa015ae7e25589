"""assistant.runtime.fetch: a local GGUF (ASSISTANT_GGUF) for machines without the package index."""
import pytest

from assistant.runtime import fetch


def test_missing_local_gguf_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTANT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ASSISTANT_GGUF", str(tmp_path / "nope.gguf"))
    with pytest.raises(fetch.ModelFetchError, match="ASSISTANT_GGUF=.*nope.gguf: no such file"):
        fetch.ensure_default_model(progress=lambda *a: None)


def test_wrong_local_gguf_fails_the_checksum_and_leaves_nothing(tmp_path, monkeypatch):
    bad = tmp_path / "other.gguf"
    bad.write_bytes(b"GGUF" + bytes(1000))
    monkeypatch.setenv("ASSISTANT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ASSISTANT_GGUF", str(bad))
    with pytest.raises(fetch.ModelFetchError, match="sha256 .* does not match"):
        fetch.ensure_default_model(progress=lambda *a: None)
    models = tmp_path / "cache" / "models"
    assert not (models / fetch.DEFAULT_NAME).exists()
    assert list(models.iterdir()) == []          # the temp folder went too
    assert bad.exists()                          # the user's file is not touched
