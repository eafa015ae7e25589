"""One message of the conversation: a header, Markdown body, and the banked view.

Contract: `MessageView(role, text, stats)` shows `text` as Markdown (a user's own
text verbatim, line breaks and all, as typed or pasted). For the
assistant, `await append(step)` streams one decoding step (Markdown appended
through a MarkdownStream, statistics and banked spans updated) and
`await finish(note)` stops the stream and re-renders the whole text once (so
code fences streamed half-way render right). `set_banked(True)` swaps the body
for a plain-text view in which the spans banked by phrase speculation have a
subtle highlight. `text`, `stats`, and `role` are public read-only state.
"""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Markdown, Static

from assistant.types import AnswerStats, StepLike

BANKED_STYLE = "on #27402f"
ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System"}


class MessageView(Vertical):
    DEFAULT_CLASSES = "message"

    def __init__(self, role: str, text: str = "", stats: AnswerStats | None = None, *,
                 banked: bool = False, note: str = "") -> None:
        super().__init__(classes=f"message {role}")
        self.role = role
        self.text = text
        self.stats = stats or AnswerStats.from_dict(None, text)
        self._banked = banked
        self._note = note
        self._stream = None

    def compose(self) -> ComposeResult:
        yield Static(self._header(), classes="msg-header")
        if self.role == "user":
            yield Static(Text(self.text), classes="msg-body msg-plain")
        else:
            yield Markdown(self.text, classes="msg-body")
        yield Static(self._banked_text(), classes="msg-banked")
        yield Static(self._note, classes="msg-note")

    def on_mount(self) -> None:
        self._apply_view()

    # --- views -------------------------------------------------------------------------------
    def _header(self) -> str:
        title = ROLE_TITLES.get(self.role, self.role)
        s = self.stats
        if self.role != "assistant" or not s.tokens:
            return title
        rate = f" · {s.tok_per_s:.1f} tok/s" if s.seconds else ""
        return (f"{title} [dim]· {s.tokens} tok{rate} · {s.tokens_per_pass:.2f} tok/pass"
                f" · {s.accepted_rate:.0%} banked[/]")

    def _banked_text(self) -> Text:
        out = Text(self.text or " ")
        for a, b in self.stats.banked:
            out.stylize(BANKED_STYLE, a, b)
        return out

    def _apply_view(self) -> None:
        show_banked = self._banked and self.role == "assistant"
        self.query_one(".msg-body").display = not show_banked
        banked = self.query_one(".msg-banked", Static)
        banked.display = show_banked
        if show_banked:
            banked.update(self._banked_text())
        note = self.query_one(".msg-note", Static)
        note.update(self._note)
        note.display = bool(self._note)

    def set_banked(self, on: bool) -> None:
        self._banked = on
        self._apply_view()

    def set_note(self, note: str) -> None:
        self._note = note
        self._apply_view()

    # --- streaming ---------------------------------------------------------------------------
    async def append(self, step: StepLike) -> None:
        self.stats.add(step)
        self.text += step.text
        if step.text:
            if self._stream is None:
                self._stream = Markdown.get_stream(self.query_one(".msg-body", Markdown))
            await self._stream.write(step.text)
        self.query_one(".msg-header", Static).update(self._header())
        if self._banked:
            self.query_one(".msg-banked", Static).update(self._banked_text())

    async def finish(self, note: str = "") -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        await self.query_one(".msg-body", Markdown).update(self.text)   # the final full render
        self.query_one(".msg-header", Static).update(self._header())
        self.set_note(note)
