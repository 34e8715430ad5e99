r"""Speculative decoding without a second model: drafts looked up in the text itself.

Decoding one token costs one forward pass, and on a CPU or a small batch that pass is
bound by reading the weights, not by arithmetic: a pass over several tokens costs little
more than a pass over one. Speculative decoding spends that slack. A cheap guess, the
*draft*, proposes the next $k$ tokens; one forward pass over the last token and the $k$
drafts gives the model's own choice after each of them; the drafts are kept up to the
first one the model would not have chosen, and the model's choice there is kept too. A
greedy decoder therefore produces exactly the tokens it would produce one at a time, in
fewer passes whenever drafts are accepted.

*Prompt lookup* (Saxena, 2023, https://github.com/apoorvumang/prompt-lookup-decoding; in
`transformers` as `generate(prompt_lookup_num_tokens=...)`) drafts without a second
model: it finds the last few tokens (an n-gram) earlier in the text and proposes what
followed them there. Text that quotes, summarises or edits its input repeats itself, and
then most drafts are right; free generation rarely repeats, and then a pass verifies
drafts that are all rejected, for nothing.

[`prompt_lookup`][attnlab.models.speculative.prompt_lookup] drafts as `transformers`'
`PromptLookupCandidateGenerator` does;
[`speculative_generate`][attnlab.models.speculative.speculative_generate] decodes
greedily with it, taking back the keys of rejected drafts from the caches
([`KVCache.crop`][attnlab.caches.kv.KVCache.crop]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.models.decoder import Decoder
from attnlab.rules._validation import check_positive_int, check_token_id_set, check_token_ids

__all__ = ["Speculation", "prompt_lookup", "speculative_generate"]


def prompt_lookup(
    tokens: Sequence[int], num_draft: int, max_ngram: int = 2, *, limit: int | None = None
) -> list[int]:
    """Up to `num_draft` tokens that followed the last n-gram of `tokens` where it occurred
    before: the largest n-gram (at most `max_ngram` tokens) that occurs, its first
    occurrence from the left that has tokens after it.

    The rule of `transformers`' `PromptLookupCandidateGenerator` (the tests check it
    equal): the continuation stops at the end of `tokens`, and at `limit` tokens into
    it if given; no match gives no draft.

    Args:
        tokens: The text so far.
        num_draft: Most tokens proposed.
        max_ngram: Longest n-gram matched.
        limit: Most tokens proposed, for the room left (None: `num_draft`).

    Returns:
        The draft, possibly empty.

    Examples:
        >>> prompt_lookup([5, 6, 7, 8, 1, 5, 6], num_draft=3)  # "5 6" was followed by 7 8 1
        [7, 8, 1]
        >>> prompt_lookup([1, 2, 3], num_draft=3)  # nothing repeats
        []
    """
    n = len(tokens)
    most = num_draft if limit is None else min(num_draft, limit)
    for size in range(min(max_ngram, n - 1), 0, -1):
        tail = list(tokens[n - size :])
        for start in range(n - size + 1):
            if list(tokens[start : start + size]) == tail and start + size < min(
                start + size + most, n
            ):
                return list(tokens[start + size : min(start + size + most, n)])
    return []


@dataclass
class Speculation:
    """What a speculative decoding run did.

    Attributes:
        passes: Forward passes after the prompt's.
        drafted: Draft tokens proposed.
        accepted: Draft tokens kept.
        new_tokens: Tokens produced.
    """

    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    new_tokens: int = 0

    @property
    def acceptance(self) -> float:
        """Share of the drafted tokens kept (0 when none was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """New tokens per forward pass after the prompt's (1 for plain decoding)."""
        return self.new_tokens / max(self.passes, 1)


def speculative_generate(
    model: Decoder,
    ids: Tensor,
    max_new_tokens: int,
    *,
    num_draft: int = 10,
    max_ngram: int = 2,
    eos_token_id: int | Sequence[int] | None = None,
) -> tuple[Tensor, Speculation]:
    """Greedy decoding of one prompt, verifying prompt-lookup drafts in one pass each.

    Each pass feeds the last token and a draft of up to `num_draft` tokens
    ([`prompt_lookup`][attnlab.models.speculative.prompt_lookup] over the prompt and the
    tokens so far); the drafts equal to the model's greedy choices are kept, then its
    choice after them, and the caches take back the keys of the rest. The tokens are
    those of `model.generate(ids, max_new_tokens)` (the tests check it), up to float
    rounding: a pass over several tokens sums in another order than one over one, so a
    near tie of the two best logits may break the other way.

    Args:
        model: A decoder of attention layers (no linear-attention, latent or shared
            layers: their caches cannot take tokens back).
        ids: The prompt, `(t,)` or `(1, t)`.
        max_new_tokens: Most tokens to add.
        num_draft: Most draft tokens per pass.
        max_ngram: Longest n-gram prompt lookup matches.
        eos_token_id: Token id(s) that end the text (kept, then decoding stops).

    Returns:
        `(ids followed by the new tokens, in the shape of ids; what the run did)`.

    Raises:
        TypeError: If `ids` is not an integer tensor.
        ValueError: If `ids` holds more than one sequence, a setting is not positive,
            the text would pass the model's positions, or the model has layers whose
            caches cannot take tokens back.
    """
    c = model.config
    prompt = check_token_ids("ids", ids, c.vocab_size)
    flat = prompt.reshape(-1) if prompt.ndim == 1 or prompt.shape[0] == 1 else None
    if flat is None:
        raise ValueError(f"ids must hold one sequence, (t,) or (1, t), got {tuple(ids.shape)}")
    steps = check_positive_int("max_new_tokens", max_new_tokens)
    check_positive_int("num_draft", num_draft)
    check_positive_int("max_ngram", max_ngram)
    eos = check_token_id_set("eos_token_id", eos_token_id, c.vocab_size)
    room = flat.shape[0] + steps + num_draft
    if flat.shape[0] + steps > c.max_positions:
        raise ValueError(
            f"ids has {flat.shape[0]} tokens and max_new_tokens={steps}: past the model's "
            f"max_positions={c.max_positions}"
        )
    caches = model.make_cache(1, min(room, c.max_positions), rolling=False)
    if not all(cache.croppable for cache in caches):
        kinds = sorted({type(cache).__name__ for cache in caches})
        raise ValueError(
            f"the model's layers keep caches that cannot take back rejected drafts ({kinds}): "
            "speculative decoding needs attention layers with static or dynamic caches"
        )
    stats = Speculation()
    text = flat.tolist()
    with torch.inference_mode():
        logits = model(flat[None], cache=caches, last_only=True)  # (1, 1, vocab)
        new = [int(logits[0, -1].argmax())]
        while len(new) < steps and new[-1] not in eos:
            room_left = steps - len(new) - 1  # the pass adds one token of its own
            draft = prompt_lookup(text + new, num_draft, max_ngram, limit=room_left)
            block = torch.tensor([new[-1], *draft], device=flat.device)  # (1 + k,)
            held = caches[0].seen
            choice = model(block[None], cache=caches)[0].argmax(-1).tolist()  # (1 + k,)
            kept = 0
            while kept < len(draft) and choice[kept] == draft[kept]:
                kept += 1
            for cache in caches:  # the last token and the kept drafts stay cached
                cache.crop(held + 1 + kept)
            produced = [*draft[:kept], choice[kept]]
            if any(token in eos for token in produced):  # stop at the first end token
                produced = produced[: next(i for i, t in enumerate(produced) if t in eos) + 1]
            new += produced[: steps - len(new)]
            stats.passes += 1
            stats.drafted += len(draft)
            stats.accepted += kept
    stats.new_tokens = len(new)
    out = torch.cat([flat, torch.tensor(new, dtype=flat.dtype, device=flat.device)])
    return (out if ids.ndim == 1 else out[None]), stats
