"""`assistant ask`: answer prompts without the UI and record them in the profile's history.

Contract: `assistant ask "PROMPT" [--profile P] [--json] [--max-new-tokens N]` answers
one prompt; `assistant ask --file PROMPTS.jsonl` answers every prompt of a JSON Lines
file (prompt field found by assistant.runtime.jsonl.read_prompts; bad lines are reported as
FILE:LINE on stderr and skipped). The session is loaded once from the profile
(target, dtype, head, memory budget). Each answer is streamed to stdout (or printed
as one JSON object per answer with --json: id, prompt, answer, finish, new_tokens,
forward_passes, tokens_per_pass, drafted_tokens, seconds, tokens_per_second,
conversation_id, message_id, profile; the names of `assistant bench`'s rows) and
stored as a new conversation whose assistant message is marked accepted, with its
statistics (assistant.types.AnswerStats, the shape the chat reads), in one transaction.
Progress goes to stderr. Exit 0 when everything asked was answered, 1 when a prompt
or a line could not be (the others are still answered and recorded).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from assistant.commands import positive_int
from assistant.types import AnswerStats


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("ask", help="answer a prompt (or a JSONL file of prompts) without the UI",
                              description="Answer without the UI; each answer is recorded as accepted "
                                          "in the profile's history.")
    p.add_argument("prompt", nargs="?", help="the prompt (omit with --file)")
    p.add_argument("--file", metavar="PROMPTS.jsonl", help="answer every prompt of a JSON Lines file")
    p.add_argument("--profile", default=None, help="profile name (default: $ASSISTANT_PROFILE or 'default')")
    p.add_argument("--json", action="store_true", help="print one JSON object per answer")
    p.add_argument("--max-new-tokens", type=positive_int, default=None, metavar="N",
                   help="answer length limit (default: the profile's max_new_tokens)")
    p.add_argument("--engine", choices=("auto", "eager", "compiled"), default=None,
                   help="decode engine (assistant/runtime/engine.py); auto: the measured faster on this device")
    p.add_argument("--dtype", choices=("auto", "fp32", "bf16", "int8"), default=None,
                   help="override the profile's dtype")
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="torch threads of the answers (default: the profile's, else measured and fitted to the "
                        "machine's load)")
    p.set_defaults(func=run)


def _prompts(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    from assistant.errors import UserError

    if args.file and args.prompt:
        raise UserError("give a prompt or --file, not both")
    if args.file:
        from assistant.runtime.jsonl import read_prompts

        return read_prompts(args.file)
    if not args.prompt:
        raise UserError("nothing to answer: give a prompt or --file PROMPTS.jsonl")
    return [{"id": 1, "prompt": args.prompt}], []


def answer_one(session: Any, prompt: str, max_new_tokens: int | None, echo: bool) -> tuple[str, AnswerStats]:
    """Stream one answer; returns (text, statistics). A cancelled step ends the answer uncounted."""
    parts: list[str] = []
    stats = AnswerStats()
    for step in session.answer([{"role": "user", "content": prompt}], max_new_tokens=max_new_tokens):
        if step.finish == "cancelled":
            stats.finish = "cancelled"
            break
        stats.add(step)
        parts.append(step.text)
        if echo and step.text:
            sys.stdout.write(step.text)
            sys.stdout.flush()
    if echo:
        sys.stdout.write("\n")
        sys.stdout.flush()
    return "".join(parts), stats


def report(stats: AnswerStats) -> dict[str, Any]:
    """The statistics as --json prints them (counted like assistant.runtime.decode.DecodeStats)."""
    return {"new_tokens": stats.tokens, "forward_passes": stats.passes,
            "tokens_per_pass": round(stats.tokens / max(stats.passes, 1), 4), "drafted_tokens": stats.drafted,
            "seconds": round(stats.seconds, 4),
            "tokens_per_second": round(stats.tokens / stats.seconds, 3) if stats.seconds > 0 else None,
            "finish": stats.finish, "target": stats.target, "dtype": stats.dtype, "head": stats.head}


def record(history: Any, prompt: str, answer: str, stats: AnswerStats, system_prompt: str) -> tuple[int, int]:
    """Store prompt + accepted answer as a new conversation, atomically; returns (conversation, message) ids."""
    title = " ".join(prompt.split())[:60]
    with history.transaction():
        conv = history.new_conversation(title, system_prompt)
        history.add_message(conv, "user", prompt)
        msg = history.add_message(conv, "assistant", answer, accepted=True, stats=stats)
    return conv, msg


def run(args: argparse.Namespace) -> int:
    from assistant.session import ContextFullError, Session
    from assistant.profiles import Profile

    prompts, errors = _prompts(args)
    for e in errors:
        print(f"[ask] skipped {e}", file=sys.stderr)
    if not prompts:
        print(f"assistant: {args.file}: no usable prompts", file=sys.stderr)
        return 1
    profile = Profile.open(args.profile, create=args.profile is None)
    history = profile.history  # fail before loading the model if the history is unusable
    overrides = {"dtype": args.dtype} if args.dtype else {}
    if args.engine:
        overrides["engine"] = args.engine
    if args.threads:
        overrides["threads"] = args.threads
    session = Session.from_profile(profile, **overrides)
    session.load()
    info = session.info()
    failed = len(errors)
    for i, item in enumerate(prompts, 1):
        if args.file:
            print(f"[ask] {i}/{len(prompts)} id={item['id']}", file=sys.stderr, flush=True)
        try:
            text, stats = answer_one(session, item["prompt"], args.max_new_tokens, echo=not args.json)
        except ContextFullError as e:
            if not args.file:
                raise
            print(f"[ask] skipped {args.file}:{item.get('line', i)}: {e}", file=sys.stderr)
            failed += 1
            continue
        stats.target, stats.dtype = info.get("model", session.config.target), session.config.dtype
        stats.head = (session.head_info or {}).get("head")
        conv, msg = record(history, item["prompt"], text, stats, session.config.system_prompt)
        out = report(stats)
        if args.json:
            print(json.dumps({"id": item["id"], "prompt": item["prompt"], "answer": text, **out,
                              "conversation_id": conv, "message_id": msg, "profile": profile.name},
                             ensure_ascii=False), flush=True)
        else:
            print(f"[ask] {out['new_tokens']} tokens, {out['forward_passes']} passes "
                  f"({out['tokens_per_pass']:.2f} tokens/pass), {out['seconds']:.2f} s", file=sys.stderr)
            if args.file:
                print()
    profile.close()
    if args.file:
        print(f"[ask] answered {len(prompts) - (failed - len(errors))} of {len(prompts)} prompts, "
              f"{len(errors)} lines skipped", file=sys.stderr)
    return 1 if failed else 0
