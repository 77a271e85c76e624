"""Prompt lookup: continue the text by copying what followed the latest earlier occurrence of its last n-gram.

Used to add one extra branch to the EAGLE-2 tree. The branch is only a proposal: the target verifies it like
every other node, so output stays exactly the target's.
"""
from __future__ import annotations

MAX_NGRAM = 3   # longest suffix matched; longer matches are tried first
MIN_NGRAM = 2   # single-token matches are too often wrong to be worth verifying


def continuation(history: list[int], length: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> list[int]:
    """`length` tokens that followed the most recent earlier occurrence of the longest matching suffix
    n-gram of `history` (n from max_ngram down to min_ngram); [] when nothing matches.

    The copy may run past the end of `history` into the tokens it is copying (as an LZ77 match does): text
    caught in a loop with a period shorter than `length` is continued round the loop rather than cut at
    its end."""
    if length <= 0:
        return []
    for n in range(min(max_ngram, len(history) - 1), min_ngram - 1, -1):
        tail = history[-n:]
        for start in range(len(history) - n - 1, -1, -1):  # latest first; the suffix itself is excluded
            if history[start:start + n] == tail:
                out: list[int] = []
                for k in range(start + n, start + n + length):
                    out.append(history[k] if k < len(history) else out[k - len(history)])
                return out
    return []
