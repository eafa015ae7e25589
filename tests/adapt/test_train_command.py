"""`assistant train` end to end on a tiny random Llama saved to disk, and its flag mapping."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from assistant.adapt.datasets import slices_path
from assistant.adapt.distill import load_answers
from assistant.adapt.pipeline import TrainConfig, run_pipeline
from assistant.cli import build_parser
from assistant.commands.train import config_from_args
from assistant.runtime.head import load_artifact


def test_flags_map_onto_frozen_config():
    args = build_parser().parse_args(["train", "--rows", "123", "--layers=-1,12", "--data", "x.jsonl:5:9",
                                      "--data", "y.jsonl"])
    cfg, tune = config_from_args(args)
    assert isinstance(cfg, TrainConfig) and tune is None
    assert cfg.rows == 123 and cfg.layers == (-1, 12)
    assert cfg.sources == (("x.jsonl", 5, 9), ("y.jsonl", 0, 10 ** 9))
    assert cfg.inner == TrainConfig().inner and cfg.gen_batch == TrainConfig().gen_batch   # absent: the defaults
    assert not cfg.distill_only
    assert config_from_args(build_parser().parse_args(["train", "--data", "x.jsonl", "--distill-only"]))[0].distill_only


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
    assert str(tmp_path) not in json.dumps(art.meta) and str(tiny_llama_dir) not in json.dumps(art.meta)
    assert art.meta["train_config"]["target"] == tiny_llama_dir.name        # the checkpoint dir by its name
    assert "date" not in art.meta and "seconds" not in art.meta["report"]   # no time: rebuilds are bit-for-bit
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


SHIPPED = Path(__file__).parents[2] / "assistant" / "runtime" / "data" / "heads"


@pytest.fixture(scope="module")
def varied_llama_dir(smol_tokenizer, tmp_path_factory):
    """A tiny random Llama whose greedy answers vary (the shared tiny_llama repeats one token: a one-row
    vocabulary that trains nothing), so mining, training and the tree-shape choice all have work to do."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(smol_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                      tie_word_embeddings=True, eos_token_id=2, bos_token_id=1, pad_token_id=2, initializer_range=0.2)
    d = tmp_path_factory.mktemp("varied-llama")
    LlamaForCausalLM(cfg).eval().save_pretrained(d)
    smol_tokenizer.save_pretrained(d)
    return d


def _tiny_recipe(tmp_path, target: str, **train) -> tuple[Path, Path]:
    """A recipe for a tiny head on a tiny target, its data folder beside it."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "qs.jsonl").write_text("".join(json.dumps({"question": q}) + "\n" for q in
                                          ["What is 2 + 3?", "Name a colour.", "Count to five.", "Say hello.",
                                           "Spell cat.", "Name a planet.", "Add 4 and 4.", "Name a fruit."]))
    keys = {"target": target, "max_new_tokens": 12, "gen_batch": 2, "rows": 30, "layers": [-1],
            "feature_layers": [-1, 1], "inner": 32, "width": 16, "epochs": 2, "batch_size": 16,
            "store_dtype": "fp16", **train}
    lines = [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
    recipe = tmp_path / "tiny.recipe.toml"
    recipe.write_text('artifact = "tiny.safetensors"\n[[data]]\nfile = "qs.jsonl"\nstart = 0\nstop = 5\n'
                      "[train]\n" + "\n".join(lines) + "\n"
                      '[tune]\nfile = "qs.jsonl"\nstart = 5\nstop = 8\nnodes = 8\ntop_k = [2, 4]\n'
                      "chain_depth = [1, 2]\nchain_width = [2]\n")
    return recipe, data


def test_recipe_flags_override_and_data_resolve_in_the_folder(tmp_path):
    recipe, data = _tiny_recipe(tmp_path, "tiny")
    args = build_parser().parse_args(["train", "--recipe", str(recipe), "--data", str(data), "--rows", "7",
                                      "--layers=-1,1"])
    cfg, tune = config_from_args(args)
    assert cfg.rows == 7 and cfg.layers == (-1, 1)                  # explicit flags win
    assert cfg.inner == 32 and cfg.gen_batch == 2 and cfg.feature_layers == (-1, 1)   # the rest: the recipe's
    assert cfg.sources == ((str(data / "qs.jsonl"), 0, 5),) and cfg.out == str(tmp_path / "tiny.safetensors")
    assert tune.held_out == (str(data / "qs.jsonl"), 5, 8) and tune.nodes == 8 and len(tune.grid()) == 4
    no_tune, out = ["--no-tune", "--out", str(tmp_path / "x.safetensors")], str(tmp_path / "x.safetensors")
    cfg, tune = config_from_args(build_parser().parse_args(["train", "--recipe", str(recipe), "--data", str(data),
                                                             *no_tune]))
    assert tune is None and cfg.out == out
    with pytest.raises(ValueError, match="folder"):   # --data names the folder, not a file, with a recipe
        config_from_args(build_parser().parse_args(["train", "--recipe", str(recipe), "--data",
                                                    str(data / "qs.jsonl")]))


@pytest.mark.parametrize("bad, match", [
    ('artifact = "h.safetensors"\n[[data]]\nfile = "/abs/qs.jsonl"\nstart = 0\nstop = 5\n', "bare file name"),
    ('artifact = "h.safetensors"\n[[data]]\nfile = "qs.jsonl"\nstart = 0\nstop = 5\n[train]\nrowz = 3\n', "rowz"),
    ('artifact = "h.safetensors"\n[[data]]\nfile = "qs.jsonl"\nstart = 0\nstop = 5\n[train]\nrows = "3"\n', "rows"),
    ('artifact = "h.safetensors"\n[[data]]\nfile = "qs.jsonl"\nstart = 0\nstop = 5\n[train]\nworkdir = "/w"\n',
     "workdir"),
    ('artifact = "/tmp/h.safetensors"\n[[data]]\nfile = "qs.jsonl"\nstart = 0\nstop = 5\n', "artifact"),
    ('artifact = "h.safetensors"\n', "data"),
])
def test_recipe_refuses_paths_and_unknown_keys(tmp_path, bad, match):
    from assistant.adapt.recipe import load_recipe

    (tmp_path / "r.toml").write_text(bad)
    with pytest.raises(ValueError, match=match):
        load_recipe(tmp_path / "r.toml", tmp_path)


def test_shipped_recipe_describes_the_shipped_head():
    """The recipe beside the shipped head names its data, flags and tree-shape step as its metadata does."""
    from safetensors import safe_open

    from assistant.adapt.pipeline import MACHINE_FIELDS
    from assistant.adapt.recipe import load_recipe
    from assistant.adapt.tune import held_out_key

    recipe = load_recipe(SHIPPED / "SmolLM2-135M-Instruct.recipe.toml", "DATA")
    with safe_open(str(recipe.artifact), framework="pt") as f:
        meta = json.loads(f.metadata()["artifact.meta"])
    assert recipe.artifact == SHIPPED / "SmolLM2-135M-Instruct.safetensors"
    assert [(Path(p).name, a, b) for p, a, b in recipe.train.sources] == \
        [(d["file"], d["start"], d["stop"]) for d in meta["training_data"]]
    config = {k: v for k, v in asdict(recipe.train).items() if k not in MACHINE_FIELDS}
    assert json.loads(json.dumps(config)) == meta["train_config"]
    drafter = meta["drafter"]
    assert held_out_key(recipe.tune.held_out) == drafter["tuned_on"] and recipe.tune.nodes == 16
    assert {k: drafter[k] for k in ("top_k", "chain_depth", "chain_width")} in recipe.tune.grid()


def test_recipe_rebuild_is_bit_for_bit(varied_llama_dir, tmp_path):
    """`assistant train --recipe` twice from empty work directories: the same bytes, tree shape included."""
    from assistant.cli import main

    recipe, data = _tiny_recipe(tmp_path, str(varied_llama_dir), max_new_tokens=24, epochs=3)
    digests = []
    for run in ("a", "b"):
        out = tmp_path / run / "tiny.safetensors"
        assert main(["train", "--recipe", str(recipe), "--data", str(data), "--workdir", str(tmp_path / run / "work"),
                     "--out", str(out), "--threads", "1"]) == 0
        digests.append((hashlib.sha256(out.read_bytes()).hexdigest(), slices_path(out).read_bytes()))
    assert digests[0] == digests[1]
    art = load_artifact(tmp_path / "a" / "tiny.safetensors")
    assert len(art.vocab) > 10 and art.meta["report"]["train_positions"] > 20     # a head that trained
    assert art.meta["drafter"]["tuned_on"] == "qs:5:8" and art.meta["drafter"]["top_k"] in (2, 4)
    assert art.meta["training_data"][0]["stop"] == 5 and art.meta["train_config"]["threads"] == 1
    keys = {a.key for a in load_answers(tmp_path / "a" / "work" / "answers.jsonl")}
    assert keys == {f"qs:{i}" for i in range(8)}                       # training, then held-out answers
    assert str(tmp_path) not in json.dumps(art.meta)


def test_held_out_answers_must_not_be_training_data(tiny_llama_dir, tmp_path):
    from assistant.adapt.tune import TuneConfig

    recipe, data = _tiny_recipe(tmp_path, str(tiny_llama_dir))
    cfg = TrainConfig(target=str(tiny_llama_dir), sources=((str(data / "qs.jsonl"), 0, 5),),
                      workdir=str(tmp_path / "w"))
    with pytest.raises(ValueError, match="held-out"):
        run_pipeline(cfg, tune=TuneConfig(held_out=(str(data / "qs.jsonl"), 4, 8)))
    assert not (tmp_path / "w").exists()                               # refused before any work
