"""Drive the real `assistant chat` in tmux (tests/tui/tmux_e2e.sh); skipped only where tmux is absent."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("tmux_e2e.sh")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_assistant_chat_in_tmux() -> None:
    exe = Path(sys.executable).parent / "assistant"
    binary = str(exe) if exe.exists() else "assistant"
    proc = subprocess.run(["bash", str(SCRIPT), binary], capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "tmux_e2e: ok" in proc.stdout
