"""Compare adapter-cycle settings on one simulated user (BENCHMARKS.md, "Online adaptation").

Each variant runs assistant.adapt.cycle.run_cycle with CycleConfig overrides on a fresh copy of PROFILE_DIR (its
adapter state reset: no replay, no state, no version the adapter published; the head the user installed, if
any, and the anchor and rehearsal slices kept: assistant.adapt.state.copy_reset),
so every variant learns from the same answers. The target's features of those answers are computed
once and cached in CACHE (they do not depend on the cycle settings; run_cycle's `features` takes the
cached ones); a variant then takes 1-2 minutes.
usage: python scripts/cycle_variants.py PROFILE_DIR '{"name": {"steps": 600, "max_nodes": 16}, ...}' [CACHE]
Prints one JSON line per variant (status, tokens per pass before/after on the held-out user answers and
on the anchor, fine-tune losses). Copies live in a temporary ASSISTANT_HOME that is removed at the end.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time


def main(src: str, variants: dict, cache: str) -> None:
    home = tempfile.mkdtemp(prefix="cycle-variants-")
    os.environ["ASSISTANT_HOME"] = home
    from assistant.adapt.cycle import CycleConfig, run_cycle
    from assistant.adapt.features import Features, paced_features
    from assistant.adapt.state import copy_reset
    from assistant.profiles import Profile
    from assistant.runtime.target import load_target

    os.makedirs(cache, exist_ok=True)

    def cached(target, answers, layers, config, pause, on_stage=None):
        key = json.dumps([target.name, list(layers), [[a.prompt_ids, a.answer_ids] for a in answers]])
        path = os.path.join(cache, hashlib.sha1(key.encode()).hexdigest()[:16] + ".safetensors")
        if os.path.exists(path):
            return Features.load(path)[0]
        f = paced_features(target, answers, layers, config, pause, on_stage)
        f.save(path, {"target": target.name})
        return f

    target = load_target("default", "fp32", progress=lambda *a: None)
    try:
        for name, overrides in variants.items():
            dst = os.path.join(home, "profiles", name)
            copy_reset(src, dst)
            prof = Profile.open(name, create=False)
            t0 = time.time()
            r = run_cycle(prof, target, CycleConfig(**overrides), features=cached)
            keep = ("status", "tokens_per_pass", "finetune", "grown", "max_nodes", "judge_costs")
            print(json.dumps({"variant": name, **overrides, **{k: r[k] for k in keep},
                              "seconds": round(time.time() - t0)}), flush=True)
            prof.close()
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else
         os.path.join(tempfile.gettempdir(), "cycle-variants-features"))
