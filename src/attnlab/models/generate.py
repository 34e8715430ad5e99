"""Choosing tokens for [`Decoder.generate`][attnlab.models.decoder.Decoder.generate].

Greedy or sampled (temperature, top-k, top-p) next tokens, the padding token of a
finished row, the end-of-sequence test, the loop that decodes one token at a time, and
the options `generate` hands to `stream`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import TypedDict

import torch
from torch import Tensor

from attnlab.caches.base import LayerCache
from attnlab.models.config import CacheKind
from attnlab.rules._validation import check_positive_int, check_token_id_set, is_real

__all__ = [
    "Sampler",
    "StreamOptions",
    "check_nonnegative_float",
    "check_share",
    "decode",
    "is_any_of",
    "pad_token",
]


def check_nonnegative_float(name: str, value: object) -> float:
    """Return `value` as a float if it is a finite real number >= 0; raise otherwise.

    The rule of a scalar for which 0 is a setting of its own (a sampling temperature,
    where 0 means greedy): Python and NumPy ints and floats; not bools, strings or
    tensors.

    Raises:
        TypeError: If `value` is a bool or not a real number.
        ValueError: If it is not finite or is negative.
    """
    if not is_real(value):
        raise TypeError(
            f"{name} must be a non-negative float, got {value!r} ({type(value).__name__})"
        )
    number = float(value)
    if not (math.isfinite(number) and number >= 0.0):
        raise ValueError(f"{name} must be a non-negative finite float, got {number}")
    return number


def check_share(name: str, value: object) -> float:
    """Return `value` as a float if it is a real number in (0, 1]; raise otherwise.

    A share of the probability mass that must keep something (top-p sampling's `top_p`;
    1 keeps everything). Unlike `check_probability` (dropout's `[0, 1)`), 0 is refused
    and 1 accepted.

    Raises:
        TypeError: If `value` is a bool or not a real number.
        ValueError: If it is not in (0, 1].
    """
    if not is_real(value):
        raise TypeError(f"{name} must be a float in (0, 1], got {value!r} ({type(value).__name__})")
    share = float(value)
    if not 0.0 < share <= 1.0:
        raise ValueError(f"{name} must be in (0, 1], got {value}")
    return share


class Sampler:
    """Pick the next token from logits `(b, vocab)`: greedy, or by (top-k, top-p) sampling."""

    def __init__(
        self,
        temperature: object,
        top_k: object,
        top_p: object,
        generator: object,
    ) -> None:
        self.temperature = check_nonnegative_float("temperature", temperature)  # 0: greedy
        self.top_k = None if top_k is None else check_positive_int("top_k", top_k)
        self.top_p = None if top_p is None else check_share("top_p", top_p)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        self.generator = generator

    def __call__(self, logits: Tensor) -> Tensor:
        if self.temperature == 0:
            return logits.argmax(dim=-1)  # (b,)
        scores = logits.float() / self.temperature
        if self.top_k is not None and self.top_k < scores.shape[-1]:
            kth = scores.topk(self.top_k, dim=-1).values[..., -1:]  # (b, 1)
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1:
            ordered, order = scores.sort(dim=-1)  # ascending
            # Drop the least likely tokens while what they hold together is <= 1 - top_p;
            # the most likely token always stays.
            drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= 1 - self.top_p
            drop[..., -1] = False
            scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
        probs = scores.softmax(dim=-1)  # (b, vocab)
        return torch.multinomial(probs, 1, generator=self.generator)[:, 0]  # (b,)


def pad_token(pad_token_id: object, eos: tuple[int, ...], vocab: int) -> int:
    """The token a finished row repeats: `pad_token_id`, else the first end token, else 0."""
    pad = check_token_id_set("pad_token_id", pad_token_id, vocab)
    return pad[0] if pad else eos[0] if eos else 0


def is_any_of(token: Tensor, ids: Sequence[int]) -> Tensor:
    """Whether each entry of `token` is one of `ids` (the end-of-sequence test)."""
    return torch.isin(token, torch.tensor(ids, device=token.device))


class StreamOptions(TypedDict, total=False):
    """The keyword arguments [`Decoder.generate`][attnlab.models.decoder.Decoder.generate]
    passes on to [`Decoder.stream`][attnlab.models.decoder.Decoder.stream]: written once,
    so that the two signatures cannot drift apart. `stream` holds their defaults and
    `generate` documents them."""

    padding_mask: Tensor | None
    temperature: float
    top_k: int | None
    top_p: float | None
    eos_token_id: int | Sequence[int] | None
    pad_token_id: int | None
    cache: CacheKind | Sequence[LayerCache]
    generator: torch.Generator | None


def decode(
    step: Callable[[Tensor, Tensor | None], Tensor],
    ids: Tensor,
    padding_mask: Tensor | None,
    steps: int,
    sample: Sampler,
    eos: tuple[int, ...],
    pad: int,
) -> Iterator[Tensor]:
    """Yield up to `steps` new tokens `(b,)` after `ids` `(b, t)`, one at a time.

    `step(new_ids, padding_mask)` returns the logits after the new ids, `(b, t, vocab)`,
    from a cache of every earlier token. Decoding stops early once every row has produced
    one of the `eos` tokens; a finished row gets `pad`.
    """
    b = ids.shape[0]
    unfinished = torch.ones(b, dtype=torch.bool, device=ids.device)
    new, mask, n = ids, padding_mask, 0
    while True:
        # Inference mode (no autograd bookkeeping at all: ~5% faster per token than
        # no_grad here) around each step only, never across a yield: the caller's code
        # between two tokens runs in its own mode.
        with torch.inference_mode():
            logits = step(new, mask)
            token = sample(logits[:, -1])  # (b,)
            if eos:
                token = torch.where(unfinished, token, torch.full_like(token, pad))
                unfinished &= ~is_any_of(token, eos)
        yield token.clone()  # a normal tensor, usable anywhere
        n += 1
        if n == steps or (eos and not bool(unfinished.any())):
            return
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(b, 1)], dim=1)  # (b, seen + 1)
        new = token[:, None]  # (b, 1)
