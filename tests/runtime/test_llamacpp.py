"""assistant.runtime.llamacpp: finding a build, the command line it runs, parsing llama.cpp's own timings."""
import os
import stat

import pytest

from assistant.runtime.llamacpp import find_build

FAKE = r"""#!/usr/bin/env bash
# stands in for llama-completion: echoes its arguments to a file, prints text and llama.cpp's perf lines
printf '%s\n' "$@" > "$(dirname "$0")/args.txt"
printf 'The answer is 391.'
[ "$FAKE_END" = 1 ] && printf ' [end of text]\n\n'
cat >&2 <<'EOF'
llama_perf_context_print:        load time =     120.00 ms
llama_perf_context_print: prompt eval time =      50.50 ms /    40 tokens (    1.26 ms per token,   792.08 tokens per second)
llama_perf_context_print:        eval time =     200.25 ms /    20 runs   (   10.01 ms per token,    99.88 tokens per second)
llama_perf_context_print:       total time =     380.00 ms /    60 tokens
EOF
"""


class Tok:
    def decode(self, ids, skip_special_tokens=True):
        assert skip_special_tokens is False           # the template's special tokens go to llama.cpp as text
        return "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def build(tmp_path):
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "llama-completion"
    exe.write_text(FAKE)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "SmolLM2-135M-Instruct.BF16.gguf").write_bytes(b"GGUF")
    return tmp_path


def test_no_build_is_none(tmp_path):
    assert find_build(tmp_path) is None


def test_finds_the_models_it_has(build):
    b = find_build(build)
    assert set(b.models) == {"BF16"}
    with pytest.raises(FileNotFoundError, match="no Q4_1 GGUF"):
        b.generate("Q4_1", [1, 2], Tok(), 8)


@pytest.mark.parametrize("ended", [False, True])
def test_generate_times_prompt_and_decode_not_load(build, monkeypatch, ended):
    monkeypatch.setenv("FAKE_END", "1" if ended else "0")
    text, seconds, passes, got_end = find_build(build).generate("BF16", [1, 2, 3], Tok(), 20, ignore_eos=True,
                                                                threads=1)
    assert text == "The answer is 391." and got_end is ended
    assert seconds == pytest.approx(0.05050 + 0.20025)       # prompt eval + eval, load time left out
    assert passes == 1 + 20
    args = (build / "bin" / "args.txt").read_text().splitlines()
    prompt = args[args.index("-p") + 1:args.index("-n")]
    assert "\n".join(prompt) == Tok().decode([], False)     # one argument, its newlines kept (printf splits the lines)
    assert args[args.index("--temp") + 1] == "0" and "--ignore-eos" in args and args[args.index("-t") + 1] == "1"


def test_bench_cli_drops_llamacpp_without_a_build(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ASSISTANT_CACHE", str(tmp_path))
    from assistant.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text("")
    assert main(["bench", "--dataset", str(data), "--methods", "llamacpp"]) == 1    # no prompts: stops there
    err = capsys.readouterr().err
    assert "llamacpp skipped: no llama.cpp build with a BF16 GGUF" in err
    assert os.path.isdir(tmp_path) and not (tmp_path / "llamacpp").exists()
