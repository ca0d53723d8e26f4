"""Bounded capture of a command's output: the head and the tail, and how much was cut."""

from __future__ import annotations


def truncate_middle(data: bytes, total_size: int, limit_chars: int) -> tuple[str, int]:
    """Decode ``data`` (all of a ``total_size``-byte output) keeping ``limit_chars`` characters.

    Returns the text (with a note in the middle when something was cut) and the number of
    characters that were cut.
    """
    text = data.decode("utf-8", errors="replace")
    if total_size <= len(data) and len(text) <= limit_chars:
        return text, 0
    head_n = limit_chars // 2
    tail_n = limit_chars - head_n
    head, tail = text[:head_n], text[-tail_n:] if tail_n else ""
    cut = max(total_size - len(data), 0) + (len(text) - head_n - tail_n)
    note = f"\n\n[... {cut} characters of output cut (limit {limit_chars}) ...]\n\n"
    return head + note + tail, cut


class OutputBuffer:
    """Keeps the first and the last ``window`` bytes of a stream, and counts the rest.

    Memory stays bounded however much is fed (``yes`` for minutes is fine).
    """

    def __init__(self, limit_chars: int) -> None:
        self.limit_chars = limit_chars
        self.window = limit_chars * 4  # bytes per character at worst in UTF-8
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.window - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            excess = len(self.tail) - self.window
            if excess > 0:
                del self.tail[:excess]

    def reset(self) -> None:
        self.head.clear()
        self.tail.clear()
        self.total = 0

    def render(self) -> tuple[str, int]:
        """The text for the agent (cut in the middle with a note) and how much was cut."""
        limit = self.limit_chars
        kept = len(self.head) + len(self.tail)
        if kept == self.total:
            return truncate_middle(bytes(self.head + self.tail), self.total, limit)
        head_text = self.head.decode("utf-8", errors="replace")[: limit // 2]
        tail_text = self.tail.decode("utf-8", errors="replace")
        tail_text = tail_text[len(tail_text) - (limit - limit // 2) :]
        cut = max(self.total - len(head_text.encode()) - len(tail_text.encode()), 0)
        note = f"\n\n[... about {cut} bytes of output cut (limit {limit} characters) ...]\n\n"
        return head_text + note + tail_text, cut
