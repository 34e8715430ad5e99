r"""Continuous batching: many requests decoded together through one paged KV cache.

A server that decodes one batch of prompts to the end before it takes the next leaves
most of its batch idle: short requests finish early and wait for the longest, and new
requests wait for all of them. *Continuous batching* (Orca, Yu et al., 2022,
https://www.usenix.org/conference/osdi22/presentation/yu) schedules at the granularity of
one token instead: every [`step`][attnlab.serving.engine.Engine.step] runs one forward pass of
the model over whatever is ready, so a request joins the batch as soon as there is room
and leaves it the moment it is done. The keys and values live in a
[`PagedKVCache`][attnlab.serving.cache.PagedKVCache], so sequences of any lengths share one pool
of blocks and a prompt that begins like an earlier one reuses that beginning's blocks.

One step of [`Engine`][attnlab.serving.engine.Engine]:

1. *Admit* waiting requests, oldest first, while the step's `max_batch_tokens` and
   `max_running` leave room: each sequence joins the cache, which says how many of its
   leading tokens are cached already (prefix caching); only the rest is computed. A
   request whose first block of tokens is that of a prompt still being read waits until
   that prompt is in the cache, to find its blocks there.
2. *Plan* the tokens of the step: one token for each running sequence (a decode step)
   and the next chunk of at most `prefill_chunk` tokens of each prompt being read
   (*chunked prefill*), oldest first, within `max_batch_tokens`.
3. *Preempt* while the blocks the plan needs are not free: the newest request gives all
   of its blocks back and waits at the front of the queue; when it is admitted again it
   recomputes its prompt and the tokens it generated (vLLM's recompute preemption). No
   block that a sequence holds is ever overwritten.
4. *Run* one forward pass over the plan: `b` rows (one per sequence) of `t` tokens (the
   longest row), right-padded. Each layer appends every row's real keys and values to
   the cache and attends through the block tables; padding queries are ignored.
5. *Sample* (greedy: the most likely token) from each row that reached its last token,
   and *finish* a request at its end token or at `max_new_tokens`: its blocks return to
   the pool.

A request submitted with `num_draft` speculates (see
[`attnlab.models.speculative`][attnlab.models.speculative]): its decode row carries its
last token and up to `num_draft` drafts found by prompt lookup in its own text, in the
same step as the other rows, a chain or (`branches > 1`) a tree fed at its nodes'
depths under its mask; step 5 keeps the drafts the model agrees with and its next
token, moves a later branch's keys next to the text, and the cache takes back the
rejected drafts' slots at once
([`truncate`][attnlab.serving.cache.PagedKVCache.truncate]), freeing their blocks. The
drafts' slots are taken and settled within one step, and drafts give way (the step runs
without them) before a request is preempted. A step whose forward pass raises takes
back whatever its layers wrote. Decoding is greedy only, so speculation keeps every
token as it was and needs no rule for sampled tokens; sampling would change step 5
alone, and a sampling request would then decode without drafts.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import get_args

import torch
from torch import Tensor

from attnlab.caches.kv import AttentionCache, Kernel
from attnlab.functional.paged import Method
from attnlab.layers.gqa import GroupedQueryAttention
from attnlab.models.decoder import Decoder
from attnlab.models.speculative import (
    DraftTree,
    accepted_path,
    check_tree_ready,
    prompt_lookup_tree,
    tree_mask,
)
from attnlab.rules._validation import (
    check_choice,
    check_int_sequence,
    check_nonnegative_int,
    check_positive_int,
    check_token_id_set,
    entry,
)
from attnlab.rules.rope import default_positions
from attnlab.serving.cache import PagedKVCache

__all__ = ["Engine"]


@dataclasses.dataclass
class _Request:
    """One request: its tokens, what it produced, and its place in the cache."""

    id: int
    prompt: list[int]
    max_new_tokens: int
    eos_token_ids: tuple[int, ...]  # the tokens that end it (none: it runs to the end)
    num_draft: int = 0  # most prompt-lookup drafts per decode step and branch (0: none)
    branches: int = 1  # occurrences of the n-gram followed: 1 drafts a chain, more a tree
    draft: DraftTree = dataclasses.field(default_factory=lambda: DraftTree((), ()))
    generated: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    seq_id: int | None = None  # its cache sequence while admitted
    computed: int = 0  # leading tokens whose keys and values are in the cache

    @property
    def tokens(self) -> list[int]:
        """The prompt and the tokens generated so far."""
        return self.prompt + self.generated

    @property
    def remaining(self) -> int:
        """Tokens to run through the model before the next token can be sampled."""
        return len(self.prompt) + len(self.generated) - self.computed

    @property
    def done(self) -> bool:
        """Whether it made `max_new_tokens` tokens or its last one is the end token."""
        last = self.generated[-1] if self.generated else None
        return len(self.generated) == self.max_new_tokens or (
            last is not None and last in self.eos_token_ids
        )


class _PagedLayer(AttentionCache):
    """One layer's view of the sequences of a step, for `Decoder.forward`.

    Row `i` of the batch is sequence `seq_ids[i]`, whose first `query_lengths[i]` tokens
    are real (the rest is right padding): their keys and values are appended to the
    cache, then every query attends through the block tables. The rows have different
    lengths (`ragged`): the engine places every token, and there is no one `seen`.
    """

    ragged = True

    def __init__(
        self,
        cache: PagedKVCache,
        layer: int,
        seq_ids: list[int],
        query_lengths: Tensor,
        method: Method,
        tree_mask: Tensor | None = None,
    ) -> None:
        self.cache = cache
        self.layer = layer
        self.seq_ids = seq_ids
        self.query_lengths = query_lengths  # (b,)
        self.method = method
        self.tree_mask = tree_mask  # (b, t, t) or None: causal

    def __repr__(self) -> str:
        return f"_PagedLayer(layer={self.layer}, seq_ids={self.seq_ids})"

    @property
    def seen(self) -> int:
        raise ValueError(
            "positions must be given with a paged cache: its sequences have different lengths"
        )

    @property
    def length(self) -> int:
        """The most tokens one of the view's sequences holds in this layer."""
        return max((self.cache.length(s, self.layer) for s in self.seq_ids), default=0)

    @property
    def nbytes(self) -> int:
        """This layer's share of the paged cache's pools."""
        return self.cache.nbytes // self.cache.num_layers

    @property
    def batch_size(self) -> int:
        return len(self.seq_ids)

    def reset(self) -> None:
        raise NotImplementedError("a paged view holds no tokens of its own: free its sequences")

    def attend(
        self, query: Tensor, key: Tensor, value: Tensor, kernel: Kernel, *, window: int | None
    ) -> Tensor:
        for i, (seq, n) in enumerate(zip(self.seq_ids, self.query_lengths.tolist(), strict=True)):
            self.cache.append(seq, self.layer, key[i, :, :n], value[i, :, :n])  # (kv, n, e)
        return self.cache.attend(
            self.layer, query, self.seq_ids, query_lengths=self.query_lengths,
            method=self.method, tree_mask=self.tree_mask,
        )  # (b, num_heads, t, v_head_dim)  # fmt: skip


class Engine:
    """A continuous-batching engine over a [`Decoder`][attnlab.models.decoder.Decoder] (greedy).

    Requests are [submitted][attnlab.serving.engine.Engine.submit] at any time;
    [`step`][attnlab.serving.engine.Engine.step] runs one batched forward pass (decode tokens of
    the running requests and a chunk of a new prompt), and
    [`run`][attnlab.serving.engine.Engine.run] steps until every request is done. Keys and values
    live in [`cache`][attnlab.serving.cache.PagedKVCache], `num_blocks` blocks of `block_size`
    tokens shared by all requests, with prefix caching: requests that begin with the same
    full blocks of tokens (a system prompt) compute them once.

    Args:
        decoder: The model; its layers must all be full causal attention (no sliding
            windows, no linear attention).
        num_blocks: Blocks in the KV cache.
        block_size: Tokens per block.
        max_batch_tokens: Most tokens one step runs (decode tokens plus the prompt chunk).
        max_running: Most requests running at once; default `max_batch_tokens` (every
            running request decodes a token per step, so no more can run within the
            budget).
        prefill_chunk: Most prompt tokens one step reads of a prompt.
        method: How attention reads the blocks, as in
            [`paged_attention`][attnlab.functional.paged.paged_attention].

    Attributes:
        cache: The [`PagedKVCache`][attnlab.serving.cache.PagedKVCache] of every layer.
        num_preemptions: How many times a request gave its blocks back to make room.
        num_cached_prompt_tokens: Tokens whose prefill the prefix cache spared (prompts,
            and the tokens of preempted requests recomputed).

    Raises:
        TypeError: If `decoder` is not a `Decoder` or a size is not an int.
        ValueError: If a size is not positive, `max_running` is more than
            `max_batch_tokens`, or a layer of the decoder is not full attention (a
            sliding-window or a linear-attention layer, or one with ALiBi).

    Examples:
        >>> from attnlab.models.config import DecoderConfig
        >>> config = DecoderConfig(vocab_size=50, d_model=24, num_layers=2, num_heads=4,
        ...                        num_kv_heads=2, head_dim=6, hidden_dim=40)
        >>> model = Decoder(config).eval()
        >>> engine = Engine(model, num_blocks=16, block_size=4)
        >>> a = engine.submit([3, 14, 15, 9, 2, 6], max_new_tokens=5)
        >>> b = engine.submit([3, 14, 15, 9, 2, 7, 1], max_new_tokens=3)  # shares a block
        >>> out = engine.run()
        >>> [len(out[a]), len(out[b])], engine.cache.num_free_blocks
        ([5, 3], 16)
        >>> alone = model.generate(torch.tensor([3, 14, 15, 9, 2, 6]), 5)[6:]
        >>> out[a] == alone.tolist()
        True
    """

    def __init__(
        self,
        decoder: Decoder,
        *,
        num_blocks: int,
        block_size: int,
        max_batch_tokens: int = 256,
        max_running: int | None = None,
        prefill_chunk: int = 64,
        method: Method = "online",
    ) -> None:
        _check_servable(decoder)
        c = decoder.config
        self.decoder = decoder
        self.max_batch_tokens = check_positive_int("max_batch_tokens", max_batch_tokens)
        if max_running is None:
            self.max_running = self.max_batch_tokens
        else:
            self.max_running = check_positive_int("max_running", max_running)
            if self.max_running > self.max_batch_tokens:
                raise ValueError(
                    f"max_running={max_running} is more than max_batch_tokens="
                    f"{max_batch_tokens}: each running request decodes one token per step, "
                    "so the step's token budget must cover them all"
                )
        self.prefill_chunk = check_positive_int("prefill_chunk", prefill_chunk)
        check_choice("method", method, get_args(Method))
        self.method = method
        weight = decoder.embed_tokens.weight
        self.cache = PagedKVCache(
            num_layers=c.num_layers,
            num_blocks=num_blocks,
            block_size=block_size,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            dtype=weight.dtype,
            device=weight.device,
        )
        self.num_preemptions = 0
        self.num_cached_prompt_tokens = 0
        self._next_id = 0
        self._waiting: collections.deque[_Request] = collections.deque()
        self._running: list[_Request] = []  # in order of admission, newest last
        self._finished: dict[int, _Request] = {}

    # --- requests -----------------------------------------------------------------

    def submit(
        self,
        prompt_ids: Sequence[int] | Tensor,
        max_new_tokens: int,
        *,
        eos_token_id: int | Sequence[int] | None = None,
        num_draft: int = 0,
        branches: int = 1,
    ) -> int:
        """Queue a request; return its id.

        Args:
            prompt_ids: The prompt's token ids, a non-empty sequence of ints or 1-d tensor.
            max_new_tokens: Most tokens to generate.
            eos_token_id: The token, or tokens, that end the request (kept in the
                output); checked like
                [`Decoder.generate`][attnlab.models.decoder.Decoder.generate]'s.
            num_draft: Most draft tokens a decode step of this request verifies
                (prompt lookup, as in
                [`speculative_generate`][attnlab.models.speculative.speculative_generate]);
                0 decodes one token per step. The tokens are the same either way.
            branches: With more than 1, a tree of drafts
                ([`prompt_lookup_tree`][attnlab.models.speculative.prompt_lookup_tree]).

        Returns:
            The request id, to find its tokens in `run`'s result.

        Raises:
            TypeError: If `prompt_ids` is not a sequence of ints, a size not an int or
                `eos_token_id` not an int, a sequence of ints or None.
            ValueError: If the prompt is empty, a token id is outside the vocabulary,
                `max_new_tokens` is not positive, or the request cannot fit: the prompt
                plus `max_new_tokens` is longer than the whole cache or than the model's
                positions.
        """
        prompt = _check_prompt(prompt_ids, self.decoder.config.vocab_size)
        steps = check_positive_int("max_new_tokens", max_new_tokens)
        eos = check_token_id_set("eos_token_id", eos_token_id, self.decoder.config.vocab_size)
        drafts = check_nonnegative_int("num_draft", num_draft)
        if (tree := check_positive_int("branches", branches)) > 1:
            check_tree_ready(self.decoder)  # slots read as positions would break a tree
        # The last generated token is never fed back: the cache holds one fewer.
        held = len(prompt) + steps - 1
        capacity = self.cache.capacity
        if held > capacity:
            raise ValueError(
                f"prompt_ids has {len(prompt)} tokens and max_new_tokens={steps}: "
                f"{held} tokens to cache, but the whole cache holds {capacity} "
                f"(num_blocks={self.cache.num_blocks} x block_size={self.cache.block_size})"
            )
        if held + 1 > self.decoder.config.max_positions:
            raise ValueError(
                f"prompt_ids has {len(prompt)} tokens and max_new_tokens={steps}: past "
                f"the model's max_positions={self.decoder.config.max_positions}"
            )
        request = _Request(self._next_id, prompt, steps, eos, drafts, tree)
        self._next_id += 1
        self._waiting.append(request)
        return request.id

    def cancel(self, request_id: int) -> None:
        """Stop request `request_id`: it leaves the queue or the batch, its blocks are freed.

        The tokens it generated so far stay in `run`'s result.

        Raises:
            ValueError: If there is no such request or it has finished already.
        """
        request = self._find(request_id)
        if request in self._running:
            self._release(request)
            self._running.remove(request)
        else:
            self._waiting.remove(request)
        self._finished[request.id] = request

    def logprobs(self, request_id: int) -> list[float]:
        """The log-probability under the model of each token request `request_id` made."""
        return list(self._find(request_id, finished_too=True).logprobs)

    def _find(self, request_id: object, *, finished_too: bool = False) -> _Request:
        if isinstance(request_id, bool) or not isinstance(request_id, int):
            raise TypeError(f"request_id must be an int, got {request_id!r}")
        if request_id in self._finished:
            if finished_too:
                return self._finished[request_id]
            raise ValueError(f"request_id {request_id} has finished already")
        for request in (*self._waiting, *self._running):
            if request.id == request_id:
                return request
        raise ValueError(f"request_id {request_id} is not a request of this engine")

    # --- scheduling ---------------------------------------------------------------

    def _admit(self) -> None:
        """Start waiting requests, oldest first, while the step's tokens and `max_running`
        leave room. A request whose first block of tokens is that of a prompt still
        being read waits for it, and then finds that block in the prefix cache."""
        bs = self.cache.block_size
        while self._waiting and len(self._running) < self.max_running:
            head = self._waiting[0].tokens
            reading = [r for r in self._running if r.remaining > 1]
            budget = self.max_batch_tokens - sum(r.remaining for r in self._running)
            if budget <= 0 or any(len(head) >= bs and r.tokens[:bs] == head[:bs] for r in reading):
                return
            request = self._waiting.popleft()
            # submit checked the prompt; inside step (an entry) the cache does not check again.
            request.seq_id, request.computed = self.cache.add_sequence(request.tokens)
            self.num_cached_prompt_tokens += request.computed
            self._running.append(request)

    def _plan(self, drafts: bool = True) -> list[tuple[_Request, int]]:
        """How many tokens each running request runs this step (a decoding one: its last
        token and its drafts), within the budget."""
        budget = self.max_batch_tokens - sum(1 for r in self._running if r.remaining == 1)
        plan = []
        for request in self._running:
            request.draft = DraftTree((), ())
            if request.remaining == 1:
                room = request.max_new_tokens - len(request.generated) - 1
                most = min(request.num_draft, budget, room) if drafts else 0
                if most > 0:
                    tree = prompt_lookup_tree(request.tokens, most, branches=request.branches)
                    request.draft = DraftTree(tree.tokens[:budget], tree.parents[:budget])
                budget -= len(request.draft)
                n = 1 + len(request.draft)
            else:
                n = min(request.remaining, self.prefill_chunk, budget)
                budget -= n
            if n > 0:
                plan.append((request, n))
        return plan

    def _blocks_needed(self, plan: list[tuple[_Request, int]]) -> int:
        """New blocks the plan's tokens need (writes start past the shared prefix)."""
        bs = self.cache.block_size
        return sum(
            max(0, -(-(r.computed + n) // bs) - len(self.cache.block_table(self._seq(r))))
            for r, n in plan
        )

    def _preempt(self, request: _Request) -> None:
        """Give back the blocks of `request`; it waits first in line to be recomputed."""
        self._release(request)
        self._running.remove(request)
        self._waiting.appendleft(request)
        self.num_preemptions += 1

    def _release(self, request: _Request) -> None:
        self.cache.free(self._seq(request))
        request.seq_id, request.computed = None, 0

    @staticmethod
    def _seq(request: _Request) -> int:
        assert request.seq_id is not None  # admitted
        return request.seq_id

    # --- running ------------------------------------------------------------------

    @entry
    def step(self) -> dict[int, list[int]]:
        """Run one batched forward pass; return the tokens each request made in it.

        If the pass raises, the keys it wrote are taken back (the blocks it took are
        free again) and every request's tokens stand as before the step; admissions and
        preemptions made in it stay.

        Returns:
            `{request_id: tokens}` for the requests that produced tokens: one, or with
            drafts up to `num_draft + 1` (a request still reading its prompt produces
            none); empty when there is nothing to do.
        """
        self._admit()
        plan = self._plan()
        if plan and self._blocks_needed(plan) > self.cache.num_free_blocks:
            plan = self._plan(drafts=False)  # drafts give way before a request does
        while plan and self._blocks_needed(plan) > self.cache.num_free_blocks:
            self._preempt(self._running[-1])
            plan = self._plan(drafts=False)
        if not plan:
            return {}
        try:
            logits = self._forward(plan)  # (b, k, vocab_size): each row's last k positions
        except BaseException:
            for request, _ in plan:  # the layers that ran wrote keys: take them back
                self.cache.truncate(self._seq(request), request.computed)
            raise
        logp = torch.log_softmax(logits.float(), dim=-1)  # (b, k, vocab_size)
        made = {}
        for row, (request, n) in enumerate(plan):
            if request.remaining > n:  # a prompt chunk before the last: nothing to sample
                request.computed += n
                continue
            made[request.id] = self._accept(request, logp[row])
        return made

    def _accept(self, request: _Request, logp: Tensor) -> list[int]:
        """Keep the drafts the model agrees with and its next token; take back the rest's
        keys. `logp` `(k, vocab_size)`: after the row's last real token and its drafts."""
        draft, choice = request.draft, logp.argmax(-1).tolist()  # (k,)
        path = accepted_path(draft, choice)  # places in the row: root 0, node i at i + 1
        start, rows = request.computed, [0, *path]  # the row that chose each new token
        request.computed += request.remaining + len(path)
        if path != list(range(1, len(path) + 1)):  # a later branch: move its keys up
            _keep_path(self.cache, self._seq(request), start, path)
        elif len(path) < len(draft):
            self.cache.truncate(self._seq(request), request.computed)
        made = []
        made_here = [*(draft.tokens[p - 1] for p in path), choice[rows[-1]]]
        for row, token in zip(rows, made_here, strict=True):
            request.generated.append(token)
            request.logprobs.append(float(logp[row, token]))
            made.append(token)
            if request.done:
                self._release(request)
                self._running.remove(request)
                self._finished[request.id] = request
                break
        return made

    def _forward(self, plan: list[tuple[_Request, int]]) -> Tensor:
        """The logits after each row's last real tokens, `(b, k, vocab_size)`: a draft
        row's last token and drafts, the last one's repeated in other rows."""
        device = self.cache.key_pools.device
        ids, positions, lengths, at, tree_mask = _rows(plan, device)
        seqs = [self._seq(r) for r, _ in plan]
        layers = [
            _PagedLayer(self.cache, i, seqs, lengths, self.method, tree_mask)
            for i in range(self.cache.num_layers)
        ]
        with torch.inference_mode():  # unembed only each row's last real token (and drafts)
            logits: Tensor = self.decoder(
                ids, cache=layers, positions=positions, logits_at=at
            )  # (b, k, vocab)
        return logits

    @property
    def has_work(self) -> bool:
        """Whether some request is waiting or running."""
        return bool(self._waiting or self._running)

    def run(self) -> dict[int, list[int]]:
        """Step until no request is left; return every finished request's tokens.

        Returns:
            `{request_id: generated token ids}`, for all requests finished (or
            cancelled) so far, in the order they were submitted.
        """
        while self.has_work:
            self.step()
        return {i: list(self._finished[i].generated) for i in sorted(self._finished)}


def _check_servable(decoder: object) -> None:
    """Raise unless `decoder` is a Decoder whose layers the paged cache can serve."""
    if not isinstance(decoder, Decoder):
        raise TypeError(f"decoder must be an attnlab Decoder, got {type(decoder).__name__}")
    c = decoder.config
    if c.windows is not None and any(w is not None for w in c.windows):
        raise ValueError(
            f"decoder has sliding-window layers (windows={c.windows}); the engine's "
            "paged attention is full causal attention"
        )
    for i in range(c.num_layers):
        if c.kind(i) == "linear":
            raise ValueError(
                f"decoder layer {i} is a 'linear' layer (layer_kinds[{i}]='linear'): "
                "the engine's paged cache holds keys and values of attention layers "
                "only, not a linear layer's state; serve this model with "
                "Decoder.generate"
            )
    if c.chunks is not None and any(chunk is not None for chunk in c.chunks):
        raise ValueError(
            f"decoder has chunked-attention layers (chunks={c.chunks}); the engine's "
            "paged attention is full causal attention"
        )
    if c.global_attention is not None or c.kv_sources is not None:
        raise ValueError(
            "decoder has global layers of other sizes or layers that read another "
            "layer's keys (Gemma 4: config.global_attention, config.kv_sources): the "
            "engine's paged cache holds one size of keys for every layer; serve this "
            "model with Decoder.generate"
        )
    if c.latent is not None:
        raise ValueError(
            "decoder's attention is latent (MLA, config.latent): the engine's paged "
            "cache holds grouped-query keys and values, not latents; serve this model "
            "with Decoder.generate"
        )
    for name, module in decoder.named_modules():
        if isinstance(module, GroupedQueryAttention) and module.alibi_slopes is not None:
            raise ValueError(
                f"decoder's {name} has ALiBi (scores.alibi_slopes): the engine's paged "
                "attention adds no position bias; serve this model with Decoder.generate"
            )


def _check_prompt(prompt_ids: object, vocab: int) -> list[int]:
    ids = check_int_sequence("prompt_ids", prompt_ids, high=vocab, within="the vocabulary ")
    if not len(ids):
        raise ValueError("prompt_ids must hold at least one token")
    return ids.tolist() if isinstance(ids, Tensor) else ids


def _rows(
    plan: list[tuple[_Request, int]], device: torch.device
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """A step's batch: `ids` and `positions` `(b, t)` (right-padded), the real tokens per
    row `(b,)`, the places to unembed `(b, k)` (a draft row's last token and drafts, the
    last place repeated in other rows), and the rows' masks among their own tokens `(b,
    t, t)`, None while every row is causal (no tree branches)."""
    t = max(n for _, n in plan)
    ids = torch.zeros(len(plan), t, dtype=torch.long, device=device)  # (b, t)
    positions = torch.zeros(len(plan), t, dtype=torch.long, device=device)  # (b, t)
    chains = all(r.draft.is_chain for r, _ in plan)  # then the causal rule is every mask
    masks = None if chains else torch.ones(len(plan), t, t, dtype=torch.bool, device=device).tril()
    for row, (request, n) in enumerate(plan):
        start, draft = request.computed, request.draft
        ids[row, :n] = torch.tensor((request.tokens + list(draft.tokens))[start : start + n])
        # Padding repeats the last position: valid for RoPE, ignored by attention.
        positions[row] = default_positions(start, t, device).clamp(max=start + n - 1)
        if masks is not None and not draft.is_chain:  # a tree: its nodes at their depths
            positions[row, :n] = start + torch.tensor([0, *draft.depths], device=device)
            masks[row, :n, :n] = tree_mask(draft.parents)
    lengths = torch.tensor([n for _, n in plan], device=device)  # (b,)
    k = 1 + max(len(r.draft) for r, _ in plan)
    drafts = torch.tensor([len(r.draft) for r, _ in plan], device=device)  # (b,)
    at = (lengths - 1 - drafts)[:, None] + torch.arange(k, device=device)  # (b, k)
    return ids, positions, lengths, at.minimum(lengths[:, None] - 1), masks


def _keep_path(cache: PagedKVCache, seq: int, start: int, path: list[int]) -> None:
    """Keep a verified row's first token (at `start`) and its accepted drafts at places
    `path` of the row, moved next to it in every layer; forget the other drafts."""
    table = torch.tensor(cache.block_table(seq), device=cache.key_pools.device)
    slots = torch.tensor([start + p for p in path], device=table.device)  # (kept,)
    blocks, within = table[slots // cache.block_size], slots % cache.block_size
    kept = [(cache.key_pools[i][:, blocks, within], cache.value_pools[i][:, blocks, within])
            for i in range(cache.num_layers)]  # fmt: skip  # (kv, kept, head_dim) each
    cache.truncate(seq, start + 1)
    for layer, (keys, values) in enumerate(kept):
        cache.append(seq, layer, keys, values)
