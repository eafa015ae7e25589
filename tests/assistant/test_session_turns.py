"""A chat on the real SmolLM2 (fp32): every turn after the first starts from the cache the last answer left,
prefills only what the conversation added, and answers exactly what generate() answers to the whole
conversation re-rendered by the chat template."""
import pytest
import torch

pytestmark = pytest.mark.slow

TURNS = ["Write two sentences about the sea.", "Now say the same about mountains.",
         "Which of the two would you visit in winter, and why?"]


def test_each_turn_prefills_the_new_message_only_and_equals_generate():
    from assistant.session import Session, SessionConfig

    s = Session(SessionConfig(dtype="fp32", device="cpu", engine="eager", max_new_tokens=40, history_lookup=False))
    s.load()
    messages, before = [], 0
    for i, text in enumerate(TURNS):
        messages.append({"role": "user", "content": text})
        steps = list(s.answer(messages))
        tokens = [t for step in steps for t in step.tokens]
        ids = s.prompt_ids(messages)
        x = torch.tensor([ids])
        ref = s.target.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=40,
                                      pad_token_id=0)[0, len(ids):].tolist()
        assert tokens == ref[:len(tokens)] and (len(tokens) == len(ref) or steps[-1].finish == "eos")
        prefilled = steps[0].tree_size
        if i == 0:
            assert prefilled == len(ids)
        else:   # the earlier turns come from the kept cache: the new message and the template's glue are left
            assert prefilled < len(ids) - before + 12, (prefilled, len(ids), before)
        before = len(ids) + len(tokens)
        messages.append({"role": "assistant", "content": s.target.tokenizer.decode(tokens, skip_special_tokens=True)})
