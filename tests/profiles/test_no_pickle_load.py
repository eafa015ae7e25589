"""No .py file in the repository unpickles: no torch.load / pickle.load(s) calls (an AST scan)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".venv", ".git", "node_modules", "build", "__pycache__", ".pytest_cache"}
UNSAFE_MODULES = {"torch", "pickle", "cPickle", "_pickle", "dill", "joblib", "cloudpickle", "pandas"}
UNSAFE_FUNCS = {"load", "loads", "read_pickle", "Unpickler"}


def python_files() -> list[Path]:
    out = []
    for p in REPO.rglob("*.py"):
        rel = p.relative_to(REPO).parts
        if not any(part in SKIP_DIRS or part.startswith(".venv") for part in rel):
            out.append(p)
    return out


def unsafe_calls(source: str, filename: str = "<src>") -> list[str]:
    """'file:line: call' for every call of an unpickling loader, through any import alias."""
    tree = ast.parse(source, filename)
    modules: dict[str, str] = {}   # local name -> module
    funcs: dict[str, str] = {}     # local name -> "module.func"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                root = a.name.split(".")[0]
                if root in UNSAFE_MODULES:
                    modules[(a.asname or a.name).split(".")[0]] = root
        elif isinstance(node, ast.ImportFrom) and node.module:
            root = node.module.split(".")[0]
            for a in node.names:
                if root in UNSAFE_MODULES and a.name in UNSAFE_FUNCS:
                    funcs[a.asname or a.name] = f"{root}.{a.name}"
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = None
        if isinstance(f, ast.Attribute) and f.attr in UNSAFE_FUNCS and isinstance(f.value, ast.Name):
            mod = modules.get(f.value.id, f.value.id if f.value.id in UNSAFE_MODULES else None)
            if mod and not (mod == "pandas" and f.attr != "read_pickle") and not (mod == "joblib" and f.attr != "load"):
                name = f"{mod}.{f.attr}"
        elif isinstance(f, ast.Name) and f.id in funcs:
            name = funcs[f.id]
        if name:
            found.append(f"{filename}:{node.lineno}: {name}")
    return found


def test_scanner_catches_aliases():
    src = ("import torch\nimport pickle as pk\nfrom torch import load as tl\nimport torch as T\n"
           "torch.load('x')\npk.loads(b'')\ntl('y')\nT.load('z')\njson.load(f)\n")
    assert [s.split(": ")[1] for s in unsafe_calls(src)] == ["torch.load", "pickle.loads", "torch.load", "torch.load"]


def test_no_unpickling_anywhere():
    files = python_files()
    assert any(p.name == "heads.py" for p in files)
    bad = [hit for p in files for hit in unsafe_calls(p.read_text("utf-8", errors="replace"), str(p.relative_to(REPO)))]
    assert bad == [], "unpickling loaders (use safetensors): " + "; ".join(bad)


def test_compiled_forwards_are_read_in_one_place():
    """torch's saved compiled functions are pickles: they are read by assistant/runtime/precompile.py alone, which
    reads them only from the user's own cache directory and only when no one else can write them."""
    users = [str(p.relative_to(REPO)) for p in python_files()
             if "load_compiled_function" in p.read_text("utf-8", errors="replace")
             and not p.relative_to(REPO).parts[0] == "tests"]
    assert users == ["assistant/runtime/precompile.py"]
    src = (REPO / "assistant" / "runtime" / "precompile.py").read_text()
    assert "_private(path)" in src and "compiled_dir()" in src
