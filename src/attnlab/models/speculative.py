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

One draft is one guess. Where the n-gram occurred several times, each occurrence offers
its own continuation, and all of them can be checked in the same pass: merged where they
agree, they form a [`DraftTree`][attnlab.models.speculative.DraftTree]
([`prompt_lookup_tree`][attnlab.models.speculative.prompt_lookup_tree]). The pass feeds
every node of the tree at once, each at the position of its depth, under a *tree
attention mask* ([`tree_mask`][attnlab.models.speculative.tree_mask], and as a
FlexAttention `mask_mod`, [`tree_mask_mod`][attnlab.models.speculative.tree_mask_mod]):
a node sees the cached text and its own ancestors, not its siblings' branches (SpecInfer,
Miao et al., 2023, https://arxiv.org/abs/2305.09781; Medusa, Cai et al., 2024).
[`verify_tree`][attnlab.models.speculative.verify_tree] keeps the longest path the model
agrees with and moves its keys next to the text
([`KVCache.retain`][attnlab.caches.kv.KVCache.retain]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnlab.rules._validation import (
    check_nonnegative_int,
    check_positive_int,
    check_token_id_set,
    check_token_ids,
)

if TYPE_CHECKING:  # annotations only: the serving engine imports prompt lookup from here
    from attnlab.caches.kv import KVCache
    from attnlab.functional.flex import MaskMod
    from attnlab.models.decoder import Decoder

__all__ = [
    "DraftTree",
    "Speculation",
    "accepted_path",
    "prompt_lookup",
    "prompt_lookup_tree",
    "speculative_generate",
    "tree_mask",
    "tree_mask_mod",
    "verify_tree",
]


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
    most = _check_lookup(num_draft, max_ngram, limit)
    size, starts = _occurrences(tokens, max_ngram)
    return list(tokens[starts[0] + size : starts[0] + size + most]) if starts else []


def _check_lookup(num_draft: object, max_ngram: object, limit: object) -> int:
    """The most tokens a lookup may propose, after checking its settings."""
    most = check_positive_int("num_draft", num_draft)
    check_positive_int("max_ngram", max_ngram)
    if limit is not None:
        most = min(most, check_nonnegative_int("limit", limit))
    return most


def _occurrences(tokens: Sequence[int], max_ngram: int) -> tuple[int, list[int]]:
    """`(n-gram size, the starts of its earlier occurrences with tokens after them)` for
    the largest n-gram of the end of `tokens` that occurs before; `(0, [])` if none."""
    n = len(tokens)
    for size in range(min(max_ngram, n - 1), 0, -1):
        tail = list(tokens[n - size :])
        starts = [s for s in range(n - size) if list(tokens[s : s + size]) == tail]
        if starts:
            return size, starts
    return 0, []


def check_parents(parents: Sequence[int]) -> list[int]:
    """`parents` as a list, checked: each node's parent is -1 (the root: the last token
    committed) or a node before it, so the nodes come in an order a pass can feed.

    Raises:
        TypeError: If a parent is not an int.
        ValueError: If the parents form a cycle, or a node's parent comes after it.
    """
    got = list(parents)
    if not all(isinstance(p, int) and not isinstance(p, bool) for p in got):
        raise TypeError(f"parents must be ints (-1 for the root), got {got!r}")
    for node, parent in enumerate(got):
        seen, at = [node], parent
        while 0 <= at < len(got) and at not in seen:  # follow the parents up
            seen.append(at)
            at = got[at]
        if 0 <= at < len(got):
            loop = " -> ".join(map(str, [*seen[seen.index(at) :], at]))
            raise ValueError(f"parents form a cycle ({loop}): a draft tree has none")
    for node, parent in enumerate(got):
        if not -1 <= parent < node:
            raise ValueError(
                f"parents[{node}]={parent}: a node's parent must be -1 (the root) or a node "
                f"before it, in [-1, {node})"
            )
    return got


@dataclass(frozen=True)
class DraftTree:
    """Draft tokens as a tree: several guesses at once, sharing their common starts.

    The root is the last token committed (not stored); node `i` holds `tokens[i]` and
    follows `parents[i]`, -1 for the root. Parents come before their children.

    Attributes:
        tokens: Each node's token.
        parents: Each node's parent, -1 for the root.

    Raises:
        ValueError: If the lengths differ, or the parents form a cycle or come later.

    Examples:
        >>> tree = DraftTree((7, 8, 9), (-1, 0, -1))  # two guesses: "7 8" and "9"
        >>> tree.depths
        (1, 2, 1)
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(
                f"tokens has {len(self.tokens)} nodes but parents has {len(self.parents)}"
            )
        check_parents(self.parents)

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> DraftTree:
        """One guess: each token follows the one before."""
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> tuple[int, ...]:
        """Each node's distance from the root (1 for the root's children)."""
        depth: list[int] = []
        for parent in self.parents:
            depth.append(1 if parent < 0 else depth[parent] + 1)
        return tuple(depth)

    @property
    def is_chain(self) -> bool:
        """True if every node follows the one before (the causal mask is the tree's)."""
        return self.parents == tuple(range(-1, len(self) - 1))


def prompt_lookup_tree(
    tokens: Sequence[int],
    num_draft: int,
    max_ngram: int = 2,
    *,
    branches: int = 4,
    limit: int | None = None,
) -> DraftTree:
    """The continuations of up to `branches` earlier occurrences of the last n-gram,
    merged into a tree where they agree.

    The n-gram is [`prompt_lookup`][attnlab.models.speculative.prompt_lookup]'s (the
    largest that occurs, at most `max_ngram` tokens), and the first branch is its draft;
    each further occurrence, left to right, adds the part of its continuation that no
    branch before it holds.

    Args:
        tokens: The text so far.
        num_draft: Most tokens per branch.
        max_ngram: Longest n-gram matched.
        branches: Most occurrences followed.
        limit: Most tokens per branch, for the room left (None: `num_draft`).

    Returns:
        The tree, possibly empty.

    Examples:
        >>> tree = prompt_lookup_tree([1, 2, 3, 1, 2, 4, 1, 2], num_draft=2)
        >>> tree.tokens, tree.parents  # "1 2" was followed by "3 1" and by "4 1"
        ((3, 1, 4, 1), (-1, 0, -1, 2))
    """
    check_positive_int("branches", branches)
    most = _check_lookup(num_draft, max_ngram, limit)
    size, starts = _occurrences(tokens, max_ngram)
    nodes: dict[tuple[int, ...], int] = {}  # path from the root -> node
    out_tokens: list[int] = []
    out_parents: list[int] = []
    for start in starts[:branches]:
        follow = list(tokens[start + size : start + size + most])
        for depth in range(len(follow)):
            path = tuple(follow[: depth + 1])
            if path not in nodes:
                nodes[path] = len(out_tokens)
                out_tokens.append(follow[depth])
                out_parents.append(nodes[path[:-1]] if depth else -1)
    return DraftTree(tuple(out_tokens), tuple(out_parents))


def tree_mask(parents: Sequence[int]) -> Tensor:
    """Which node of a draft tree sees which: `(1 + n, 1 + n)` bool, True = attend.

    Row and column 0 are the root (the last token committed), row `i + 1` node `i`: each
    sees itself and its ancestors, the root included. Prepend the cached tokens as
    columns of True to get the mask of a verifying pass.

    Args:
        parents: Each node's parent, -1 for the root (as in
            [`DraftTree`][attnlab.models.speculative.DraftTree]).

    Returns:
        The mask, lower triangular because parents come first.

    Raises:
        ValueError: As [`DraftTree`][attnlab.models.speculative.DraftTree].

    Examples:
        >>> tree_mask([-1, 0, -1]).int()  # nodes 0 and 2 are siblings
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [1, 1, 1, 0],
                [1, 0, 0, 1]], dtype=torch.int32)
    """
    got = check_parents(parents)
    mask = torch.eye(len(got) + 1, dtype=torch.bool)  # (1 + n, 1 + n)
    for node, parent in enumerate(got):
        mask[node + 1] |= mask[parent + 1]  # a node sees what its parent sees
    return mask


def tree_mask_mod(parents: Sequence[int], past: int) -> MaskMod:
    """The tree mask of a verifying pass as a FlexAttention `mask_mod`: the `1 + n` queries
    (the root, then the nodes) see the `past` cached keys, and within the tree only
    themselves and their ancestors.

    Args:
        parents: Each node's parent, -1 for the root.
        past: Keys cached before the root.

    Returns:
        `mask_mod(b, h, q_idx, kv_idx)` over `1 + n` queries and `past + 1 + n` keys.

    Raises:
        ValueError: As [`tree_mask`][attnlab.models.speculative.tree_mask], or if `past`
            is negative.

    Examples:
        >>> from attnlab.functional.flex import to_dense
        >>> to_dense(tree_mask_mod([-1, -1], past=2), 3, 5)[0, 0].int()
        tensor([[1, 1, 1, 0, 0],
                [1, 1, 1, 1, 0],
                [1, 1, 1, 0, 1]], dtype=torch.int32)
    """
    sees = tree_mask(parents)
    if isinstance(past, bool) or not isinstance(past, int) or past < 0:
        raise ValueError(f"past must be a non-negative int (the keys cached), got {past!r}")

    def tree(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        inside = sees.to(q_idx.device)[q_idx, (kv_idx - past).clamp(min=0)]
        return (kv_idx < past) | inside

    return tree


def accepted_path(tree: DraftTree, choice: Sequence[int]) -> list[int]:
    """The nodes a verifying pass keeps, as places in its block (root 0, node `i` at
    `i + 1`): from the root, the child whose token is the model's choice there, as long
    as there is one. `choice[j]` is the model's token after place `j`.

    Examples:
        >>> accepted_path(DraftTree((7, 8, 9), (-1, 0, -1)), [9, 5, 6, 4])
        [3]
    """
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(tree.parents):
        children.setdefault(parent + 1, []).append(node + 1)
    path, at = [], 0
    while nxt := [c for c in children.get(at, []) if tree.tokens[c - 1] == choice[at]]:
        at = nxt[0]
        path.append(at)
    return path


def check_tree_ready(model: Decoder) -> None:
    """Raise if a layer of `model` reads a token's slot as its position: windows, chunks,
    Llama 4's temperature tuning and ALiBi count keys by slot, and a tree node's slot is
    not its position (siblings share one)."""
    c = model.config
    alibi = any(getattr(m, "alibi_slopes", None) is not None for m in model.modules())
    kinds = {
        "windows": any(c.windows or ()),
        "chunks": any(c.chunks or ()),
        "temperature": c.temperature is not None,
        "ALiBi": alibi,
    }
    if any(kinds.values()):
        found = ", ".join(name for name, on in kinds.items() if on)
        raise ValueError(
            f"a draft tree with branches needs layers that place keys by position, but "
            f"the model has {found}: they count keys by slot, and a node's slot is not "
            "its position (draft a chain instead)"
        )


def verify_tree(model: Decoder, caches: Sequence[KVCache], last: int, tree: DraftTree) -> list[int]:
    """One forward pass over the last token and every node of `tree`; the tokens it keeps.

    The nodes are fed at the positions of their depths under the tree mask; from the
    root, the walk follows the child whose token is the model's greedy choice, as long
    as there is one. The caches keep the root and the accepted path's keys (moved next
    to the text), and forget the rest; if the pass raises, they are put back as they
    were before it.

    Args:
        model: The decoder the caches belong to.
        caches: Its caches, holding the text before `last` (they must be croppable).
        last: The last token committed, whose keys are not cached yet.
        tree: The drafts.

    Returns:
        The accepted drafts' tokens, then the model's choice after them: one more
        token than drafts kept.

    Raises:
        ValueError: If the caches cannot take tokens back, the tree does not fit in
            them or in the model's positions, or it branches and the model has layers
            that count keys by slot (windows, chunks, temperature tuning, ALiBi).
    """
    held = caches[0].seen
    room = min(
        (m for cache in caches if (m := cache.max_length) is not None),
        default=model.config.max_positions,
    )
    room = min(room, model.config.max_positions) - held
    if 1 + len(tree) > room:
        raise ValueError(
            f"the tree has {len(tree)} nodes, with the last token {1 + len(tree)} tokens, but "
            f"the caches hold {held} and have room for {room} more"
        )
    if not all(cache.croppable for cache in caches):
        kinds = sorted({type(cache).__name__ for cache in caches})
        raise ValueError(f"caches that cannot take back rejected drafts ({kinds})")
    if not tree.is_chain:
        check_tree_ready(model)
    device = model.embed_tokens.weight.device
    block = torch.tensor([last, *tree.tokens], device=device)  # (1 + n,)
    positions = held + torch.tensor([0, *tree.depths], device=device)  # (1 + n,)
    mask = None
    if not tree.is_chain:  # a chain's mask is the causal one
        nodes = tree_mask(tree.parents).to(device)  # (1 + n, 1 + n)
        mask = torch.cat([nodes.new_ones(1 + len(tree), held), nodes], dim=1)
    try:
        logits = model(block[None], cache=caches, positions=positions, attn_mask=mask)
    except BaseException:
        for cache in caches:  # nothing of the failed pass stays
            cache.crop(held)
        raise
    choice = logits[0].argmax(-1).tolist()  # (1 + n,): the model's token after each
    path = accepted_path(tree, choice)
    at = path[-1] if path else 0
    if path == list(range(1, len(path) + 1)):  # the first branch: nothing moves
        for cache in caches:
            cache.crop(held + 1 + len(path))
    else:
        kept = list(range(held + 1)) + [held + node for node in path]
        for cache in caches:
            cache.retain(kept)
    return [*(tree.tokens[node - 1] for node in path), choice[at]]


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
    branches: int = 1,
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
        num_draft: Most draft tokens per pass (per branch of a tree).
        max_ngram: Longest n-gram prompt lookup matches.
        branches: Occurrences of the n-gram followed: 1 drafts one chain
            ([`prompt_lookup`][attnlab.models.speculative.prompt_lookup]), more a tree
            ([`prompt_lookup_tree`][attnlab.models.speculative.prompt_lookup_tree]),
            verified under a tree mask by
            [`verify_tree`][attnlab.models.speculative.verify_tree].
        eos_token_id: Token id(s) that end the text (kept, then decoding stops).

    Returns:
        `(ids followed by the new tokens, in the shape of ids; what the run did)`.

    Raises:
        TypeError: If `ids` is not an integer tensor.
        ValueError: If `ids` holds more than one sequence, a setting is not positive,
            the text would pass the model's positions, the model has layers whose
            caches cannot take tokens back, or `branches > 1` and it has layers that
            count keys by slot (see [`verify_tree`][attnlab.models.speculative.verify_tree]).
    """
    c = model.config
    prompt = check_token_ids("ids", ids, c.vocab_size)
    flat = prompt.reshape(-1) if prompt.ndim == 1 or prompt.shape[0] == 1 else None
    if flat is None:
        raise ValueError(f"ids must hold one sequence, (t,) or (1, t), got {tuple(ids.shape)}")
    steps = check_positive_int("max_new_tokens", max_new_tokens)
    check_positive_int("num_draft", num_draft)
    check_positive_int("max_ngram", max_ngram)
    if check_positive_int("branches", branches) > 1:
        check_tree_ready(model)
    eos = check_token_id_set("eos_token_id", eos_token_id, c.vocab_size)
    room = flat.shape[0] + steps + num_draft * branches
    if flat.shape[0] + steps > c.max_positions:
        raise ValueError(
            f"ids has {flat.shape[0]} tokens and max_new_tokens={steps}: past the model's "
            f"max_positions={c.max_positions}"
        )
    slots = min(room, c.max_positions)
    caches = model.make_cache(1, slots, rolling=False)
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
            tree = (
                DraftTree.chain(prompt_lookup(text + new, num_draft, max_ngram, limit=room_left))
                if branches == 1
                else prompt_lookup_tree(
                    text + new, num_draft, max_ngram, branches=branches, limit=room_left
                )
            )
            fit = slots - len(text) - len(new)  # slots left beside the last token's
            tree = DraftTree(tree.tokens[:fit], tree.parents[:fit])  # parents come first
            produced = verify_tree(model, caches, new[-1], tree)
            kept = len(produced) - 1
            if any(token in eos for token in produced):  # stop at the first end token
                produced = produced[: next(i for i, t in enumerate(produced) if t in eos) + 1]
            new += produced[: steps - len(new)]
            stats.passes += 1
            stats.drafted += len(tree)
            stats.accepted += kept
    stats.new_tokens = len(new)
    out = torch.cat([flat, torch.tensor(new, dtype=flat.dtype, device=flat.device)])
    return (out if ids.ndim == 1 else out[None]), stats
