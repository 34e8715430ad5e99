"""The article's toy input: a six-word sentence, its vocabulary and its 3-d embedding.

Chapters build these step by step; later chapters (and the notebook) call these helpers
to get the very same tensors in one line.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.rules._validation import check_positive_int

__all__ = ["SENTENCE", "build_vocab", "embed_sentence", "encode"]

SENTENCE = "Life is short, eat dessert first"
"""The sentence every chapter puts through attention."""


def _words(sentence: str) -> list[str]:
    if not isinstance(sentence, str):
        raise TypeError(f"sentence must be a str, got {type(sentence).__name__}")
    return sentence.replace(",", "").split()


def build_vocab(sentence: str = SENTENCE) -> dict[str, int]:
    """Map each distinct word of `sentence` (commas dropped) to its rank in sorted order.

    Args:
        sentence: Whitespace-separated text.

    Returns:
        `{word: index}`, indices `0 .. n-1` in sorted (case-sensitive) word order.

    Raises:
        TypeError: If `sentence` is not a str.

    Examples:
        >>> build_vocab("b a, c a")
        {'a': 0, 'b': 1, 'c': 2}
    """
    return {word: i for i, word in enumerate(sorted(set(_words(sentence))))}


def encode(sentence: str = SENTENCE, vocab: dict[str, int] | None = None) -> Tensor:
    """Turn `sentence` into a tensor of word indices.

    Args:
        sentence: Whitespace-separated text.
        vocab: Word-to-index map; built from `sentence` when omitted.

    Returns:
        A 1-d `int64` tensor with one index per word (empty for an empty sentence).

    Raises:
        TypeError: If `sentence` is not a str or `vocab` not a dict.
        KeyError: If a word is not in `vocab`.

    Examples:
        >>> encode("b a, c a")
        tensor([1, 0, 2, 0])
    """
    words = _words(sentence)
    if vocab is None:
        vocab = build_vocab(sentence)
    elif not isinstance(vocab, dict):
        raise TypeError(f"vocab must be a dict of word -> index, got {type(vocab).__name__}")
    missing = [w for w in words if w not in vocab]
    if missing:
        raise KeyError(f"words not in vocab: {missing}")
    return torch.tensor([vocab[w] for w in words], dtype=torch.long)  # (num_words,)


def embed_sentence(
    sentence: str = SENTENCE, d: int = 3, *, vocab_size: int = 50_000, seed: int = 123
) -> Tensor:
    """Embed `sentence` as the article does, with `nn.Embedding` after `manual_seed(seed)`.

    The global random state is left as it was, so calling this helper does not shift the
    numbers that later `torch.rand` calls draw.

    Args:
        sentence: Whitespace-separated text.
        d: Embedding size.
        vocab_size: Rows of the embedding table (only the first few are used).
        seed: Seed set before the table is created.

    Returns:
        A `(num_words, d)` float tensor, detached from autograd.

    Raises:
        TypeError: If `sentence` is not a str, or `d`, `vocab_size` or `seed` not an int.
        ValueError: If `d` is not positive, or `vocab_size` is too small for the
            sentence's distinct words.

    Examples:
        >>> embed_sentence().shape
        torch.Size([6, 3])
        >>> embed_sentence()[0]
        tensor([ 0.3374, -0.1778, -0.3035])
    """
    check_positive_int("d", d)
    check_positive_int("vocab_size", vocab_size)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r} ({type(seed).__name__})")
    ids = encode(sentence)
    words = len(build_vocab(sentence))
    if words > vocab_size:
        raise ValueError(
            f"vocab_size must be at least the number of distinct words in sentence, "
            f"{words}, got vocab_size={vocab_size}"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        embed = nn.Embedding(vocab_size, d)
    vectors: Tensor = embed(ids).detach()  # (num_words, d)
    return vectors
