"""Tokens as text: a user prompt encoded through the chat template, and readable text for single tokens, including
tokens that hold only part of a UTF-8 character.

Byte-level BPE splits an emoji or a CJK character over several tokens; decoding one alone gives U+FFFD.
Such tokens are shown by their bytes instead (e.g. ' \\xf0\\x9f\\x98'), so trees stay honest and legible.
"""
from __future__ import annotations


def _byte_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet: printable stand-ins for the 256 byte values, and back."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTES = _byte_alphabet()


class TokenText:
    """Per-tokenizer cache of single-token display strings."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        text = self.cache.get(token)
        if text is None:
            text = self.tok.decode([token])
            if "\ufffd" in text:
                text = self._bytes(token) or text
            self.cache[token] = text
        return text

    def _bytes(self, token: int) -> str | None:
        piece = self.tok.convert_ids_to_tokens(token) if hasattr(self.tok, "convert_ids_to_tokens") else None
        if not isinstance(piece, str) or not all(c in _BYTES for c in piece):
            return None
        raw = bytes(_BYTES[c] for c in piece)
        text = raw.decode("utf-8", errors="backslashreplace")
        return text


def encode_prompt(tokenizer, text: str, raw: bool = False) -> list[int]:
    """Token ids of a user prompt, through the model's chat template unless `raw`."""
    if raw or not getattr(tokenizer, "chat_template", None):
        return tokenizer(text)["input_ids"]
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=True, return_dict=True)["input_ids"])
