"""`assistant train` end to end on a tiny random Llama saved to disk, and its flag mapping."""
from __future__ import annotations

import json
import subprocess
import sys

from assistant.adapt.pipeline import TrainConfig, run_pipeline
from assistant.cli import build_parser
from assistant.commands.train import config_from_args
from assistant.runtime.head import load_artifact


def test_flags_map_onto_frozen_config():
    args = build_parser().parse_args(["train", "--rows", "123", "--layers=-1,12", "--data", "x.jsonl:5:9",
                                      "--data", "y.jsonl"])
    cfg = config_from_args(args)
    assert isinstance(cfg, TrainConfig)
    assert cfg.rows == 123 and cfg.layers == (-1, 12)
    assert cfg.sources == (("x.jsonl", 5, 9), ("y.jsonl", 0, 10 ** 9))
    assert not cfg.distill_only and config_from_args(build_parser().parse_args(["train", "--data", "x.jsonl", "--distill-only"])).distill_only


def test_train_help_does_not_import_torch():
    code = "import sys; from assistant.cli import main\ntry:\n main(['train','--help'])\nexcept SystemExit: pass\nassert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_pipeline_end_to_end_and_resume(tiny_llama_dir, tmp_path):
    from assistant.adapt.datasets import read_slices, slices_path
    from assistant.profiles.heads import sha256_file

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"question": q}) + "\n" for q in
                            ["What is 2 + 3?", "Name a colour.", "Count to five.", "Say hello.", "Spell cat.",
                             "Name a planet."]))
    cfg = TrainConfig(target=str(tiny_llama_dir), sources=((str(data), 0, 4),), max_new_tokens=12, gen_batch=2,
                      rows=30, layers=(-1,), feature_layers=(-1, 1), inner=32, width=16, epochs=2, batch_size=16,
                      workdir=str(tmp_path / "work"), out=str(tmp_path / "head.safetensors"))
    logs: list[str] = []
    log = type("L", (), {"progress": staticmethod(lambda *a: None), "say": staticmethod(logs.append)})()
    out = run_pipeline(cfg, log)
    art = load_artifact(out)
    assert art.meta["target"] == tiny_llama_dir.name and art.meta["rows"] == len(art.vocab) > 0
    # the data named by file name, hash and range; no path of this machine anywhere in the metadata
    assert art.meta["training_data"] == [{"file": "prompts.jsonl", "sha256": sha256_file(data), "start": 0, "stop": 4}]
    assert str(tmp_path) not in json.dumps(art.meta) and "date" in art.meta
    assert "chain" in art.extra
    # the prompts after the training range ship beside the head: the adapter's anchor and rehearsal
    held = read_slices(slices_path(out))
    assert [(r["file"], r["record"], r["prompt"]) for r in held] == [("prompts.jsonl", 4, "Spell cat."),
                                                                     ("prompts.jsonl", 5, "Name a planet.")]
    assert any("kept from the generation" in m for m in logs)
    logs.clear()
    run_pipeline(cfg, log)                      # every stage resumes from the work directory
    assert any("cached" in m for m in logs)


def test_distill_only_stops_after_the_answers(tiny_llama_dir, tmp_path):
    from assistant.adapt.distill import load_answers

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"question": q}) + "\n" for q in ["What is 2 + 3?", "Say hello."]))
    work = tmp_path / "work"
    cfg = TrainConfig(target=str(tiny_llama_dir), sources=((str(data), 0, 2),), max_new_tokens=8, gen_batch=2,
                      feature_layers=(-1, 1), workdir=str(work), out=str(tmp_path / "head.safetensors"), distill_only=True)
    log = type("L", (), {"progress": staticmethod(lambda *a: None), "say": staticmethod(lambda m: None)})()
    out = run_pipeline(cfg, log)
    assert out == work / "answers.jsonl" and sorted(a.key for a in load_answers(out)) == ["prompts:0", "prompts:1"]
    assert not (tmp_path / "head.safetensors").exists() and not list(work.glob("vocab-*"))
