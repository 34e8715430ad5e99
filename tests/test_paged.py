"""attnlab.paged: paged attention equals SDPA on the same keys gathered contiguously and
PyTorch's experimental PagedAttention with compiled flex_attention; the cache's block
tables, forks, copy-on-write and prefix sharing keep every sequence's keys its own; and
bad input raises naming the argument.

Dimensions all differ: 6 query heads over 2 key/value heads (GQA), head_dim 5,
v_head_dim 3, block_size 4, sequence lengths 1 to 23.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab import validation
from attnlab.functional.paged import Method, paged_attention
from attnlab.functional.paged_fast import paged_attention_fast
from attnlab.layers.multihead import Backend
from attnlab.serving.cache import BlockAllocator, OutOfBlocksError, PagedKVCache, block_hashes

H, KV, HD, HD_V, BS = 6, 2, 5, 3, 4
LENGTHS = [1, 5, 13, 16, 23]  # partial, exact and multi-block sequences
METHODS = ["gather", "online"]


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 1e-6, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-12, "rtol": 0}


def _reference(q: Tensor, k: Tensor, v: Tensor, n_q: int) -> Tensor:
    """SDPA of the last n_q queries of q (num_heads, t_q, hd) to contiguous k, v (kv, L, hd).

    Query i sits at position L - n_q + i: bottom-right causal, built here from scratch.
    """
    t_k = k.shape[1]
    mask = torch.ones(n_q, t_k, dtype=torch.bool).tril(t_k - n_q)  # (n_q, L)
    return F.scaled_dot_product_attention(q[:, :n_q], k, v, attn_mask=mask, enable_gqa=True)


def _contiguous(pool: Tensor, table: list[int], length: int) -> Tensor:
    """Token by token through the table: (kv, length, features), independent of the code."""
    bs = pool.shape[2]
    return torch.stack([pool[:, table[p // bs], p % bs] for p in range(length)], dim=1)


# --- paged_attention on hand-made pools and shuffled tables ----------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("method", "option"),
    [("gather", {"backend": "torch"}), ("gather", {"backend": "scratch"})]
    + [("online", {"blocks_per_tile": n}) for n in (1, 3)]
    # The fast path's CPU kernels (a decode step's sampled product, fused tiles).
    + [("fast", {"blocks_per_tile": n}) for n in (1, 3)],
)
@pytest.mark.parametrize("t_q", [1, 3])
def test_paged_attention_equals_sdpa(
    dtype: torch.dtype, method: str, option: dict[str, object], t_q: int
) -> None:
    num_blocks = 32
    k_pool = torch.randn(KV, num_blocks, BS, HD, dtype=dtype)
    v_pool = torch.randn(KV, num_blocks, BS, HD_V, dtype=dtype)
    max_blocks = -(-max(LENGTHS) // BS)
    # Shuffled, disjoint tables: sequence b owns blocks perm[b * max_blocks ...].
    perm = torch.randperm(num_blocks)[: len(LENGTHS) * max_blocks]
    tables = perm.reshape(len(LENGTHS), max_blocks)
    lengths = torch.tensor(LENGTHS)
    # Decode rows (1 query) and prompt chunks (up to t_q) in one batch, one row empty.
    n_q = torch.tensor([min(t_q, n, 1 + i % t_q) for i, n in enumerate(LENGTHS)])
    n_q[0] = 0 if t_q > 1 else 1
    q = torch.randn(len(LENGTHS), H, t_q, HD, dtype=dtype)
    kernel = paged_attention_fast if method == "fast" else paged_attention
    out = kernel(
        q,
        k_pool,
        v_pool,
        tables,
        lengths,
        query_lengths=n_q,
        **({} if method == "fast" else {"method": method}),  # type: ignore[arg-type]
        **option,  # type: ignore[arg-type]
    )
    assert out.shape == (len(LENGTHS), H, t_q, HD_V)
    assert out.dtype == dtype
    for b, n in enumerate(LENGTHS):
        table = tables[b].tolist()
        k, v = _contiguous(k_pool, table, n), _contiguous(v_pool, table, n)
        m = int(n_q[b])
        torch.testing.assert_close(out[b, :, :m], _reference(q[b], k, v, m), **_tol(dtype))
        assert torch.count_nonzero(out[b, :, m:]) == 0  # padding rows are zeros


def test_paged_attention_methods_agree_at_scale() -> None:
    # A custom scale, a longer context, and MHA (num_heads == num_kv_heads).
    k_pool, v_pool = torch.randn(3, 40, 8, 4), torch.randn(3, 40, 8, 6)
    tables = torch.randperm(40)[:36].reshape(2, 18)
    lengths, q = torch.tensor([140, 77]), torch.randn(2, 3, 1, 4)
    online = paged_attention(q, k_pool, v_pool, tables, lengths, scale=0.3, blocks_per_tile=5)
    gather = paged_attention(q, k_pool, v_pool, tables, lengths, scale=0.3, method="gather")
    k = _contiguous(k_pool, tables[1].tolist(), 77)
    v = _contiguous(v_pool, tables[1].tolist(), 77)
    torch.testing.assert_close(online, gather)
    torch.testing.assert_close(online[1], F.scaled_dot_product_attention(q[1], k, v, scale=0.3))


@pytest.mark.parametrize("kernel", [paged_attention, paged_attention_fast])
@pytest.mark.parametrize("contiguous", [True, False])
def test_paged_decode_reads_shared_blocks_and_any_pool_layout(
    kernel: Callable[..., Tensor], contiguous: bool
) -> None:
    # Two sequences hold the same first block (a shared prefix), and a block id repeats
    # in the padding. On the fast path contiguous pools take the decode step's
    # sampled-product kernel, strided ones (a view of a larger tensor) the tiled one;
    # all equal SDPA.
    k_big, v_big = torch.randn(KV, 9, BS, HD + 2), torch.randn(KV, 9, BS, HD_V + 1)
    k_pool, v_pool = k_big[..., :HD], v_big[..., :HD_V]  # (KV, 9, BS, features), strided
    if contiguous:
        k_pool, v_pool = k_pool.contiguous(), v_pool.contiguous()
    tables = torch.tensor([[4, 7, 2], [4, 1, 1], [8, 0, 0]])
    lengths = torch.tensor([11, 6, 3])
    q = torch.randn(3, H, 1, HD)
    out = kernel(q, k_pool, v_pool, tables, lengths)
    for b, n in enumerate(lengths.tolist()):
        k = _contiguous(k_pool, tables[b].tolist(), n)
        v = _contiguous(v_pool, tables[b].tolist(), n)
        torch.testing.assert_close(out[b], _reference(q[b], k, v, 1), **_tol(torch.float32))


def test_paged_attention_of_no_sequences_is_empty() -> None:
    k_pool, v_pool = torch.randn(KV, 4, BS, HD), torch.randn(KV, 4, BS, HD_V)
    empty = torch.zeros(0, 2, dtype=torch.long)
    for method in METHODS:
        out = paged_attention(
            torch.randn(0, H, 1, HD),
            k_pool,
            v_pool,
            empty,
            empty[:, 0],
            method=method,  # type: ignore[arg-type]
        )
        assert out.shape == (0, H, 1, HD_V)


def test_paged_attention_low_precision_is_computed_in_float32() -> None:
    k_pool, v_pool = torch.randn(KV, 8, BS, HD), torch.randn(KV, 8, BS, HD_V)
    tables, lengths = torch.tensor([[3, 6, 1]]), torch.tensor([11])
    q = torch.randn(1, H, 1, HD)
    wide = paged_attention(q, k_pool, v_pool, tables, lengths)
    for method in METHODS:
        half = paged_attention(
            q.bfloat16(),
            k_pool.bfloat16(),
            v_pool.bfloat16(),
            tables,
            lengths,
            method=method,  # type: ignore[arg-type]
        )
        assert half.dtype == torch.bfloat16
        # Rounding the inputs and the output to bfloat16, nothing worse.
        torch.testing.assert_close(half.float(), wide, atol=3e-2, rtol=0)


# --- the cache ------------------------------------------------------------------


def _cache(num_blocks: int = 40, num_layers: int = 2, **kwargs: object) -> PagedKVCache:
    return PagedKVCache(
        num_layers=num_layers,
        num_blocks=num_blocks,
        block_size=BS,
        num_kv_heads=KV,
        head_dim=HD,
        v_head_dim=HD_V,
        dtype=kwargs.pop("dtype", torch.float32),  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )


class _Model:
    """What the cache should hold: every token's keys and values, per sequence and layer."""

    def __init__(self, cache: PagedKVCache) -> None:
        self.cache = cache
        self.keys: dict[int, list[Tensor]] = {}
        self.values: dict[int, list[Tensor]] = {}

    def add(self, seq: int) -> None:
        layers = range(self.cache.num_layers)
        self.keys[seq] = [torch.empty(KV, 0, HD) for _ in layers]
        self.values[seq] = [torch.empty(KV, 0, HD_V) for _ in layers]

    def append(self, seq: int, t: int, layers: range | None = None) -> None:
        for layer in range(self.cache.num_layers) if layers is None else layers:
            k, v = torch.randn(KV, t, HD), torch.randn(KV, t, HD_V)
            self.cache.append(seq, layer, k, v)
            self.keys[seq][layer] = torch.cat([self.keys[seq][layer], k], dim=1)
            self.values[seq][layer] = torch.cat([self.values[seq][layer], v], dim=1)

    def fork(self, seq: int) -> int:
        child = self.cache.fork(seq)
        self.keys[child] = list(self.keys[seq])
        self.values[child] = list(self.values[seq])
        return child

    def check(self, seqs: list[int], t_q: int = 1) -> None:
        """Attention through the cache equals SDPA on the model's contiguous keys."""
        q = torch.randn(len(seqs), H, t_q, HD)
        for layer in range(self.cache.num_layers):
            for method in METHODS:
                out = self.cache.attend(layer, q, seqs, method=method)  # type: ignore[arg-type]
                for b, s in enumerate(seqs):
                    k, v = self.keys[s][layer], self.values[s][layer]
                    torch.testing.assert_close(out[b], _reference(q[b], k, v, t_q))


def test_cache_attention_equals_sdpa_on_interleaved_appends() -> None:
    cache = _cache()
    model = _Model(cache)
    seqs = [cache.add_sequence()[0] for _ in LENGTHS]
    for s in seqs:
        model.add(s)
    rng = random.Random(0)
    # Prompt chunks and single tokens arrive in random order: tables interleave.
    left = dict(zip(seqs, LENGTHS, strict=True))
    while any(left.values()):
        s = rng.choice([s for s in seqs if left[s]])
        t = min(left[s], rng.choice([1, 1, 2, 5]))
        model.append(s, t)
        left[s] -= t
    tables = [cache.block_table(s) for s in seqs]
    assert any(t != list(range(t[0], t[0] + len(t))) for t in tables)  # non-contiguous
    assert [cache.length(s) for s in seqs] == LENGTHS
    model.check(seqs)
    # Chunked prefill: three more tokens each, attending causally to themselves.
    for s in seqs:
        model.append(s, 3)
    model.check(seqs, t_q=3)


def test_layers_share_one_table_and_write_in_turn() -> None:
    cache = _cache()
    model = _Model(cache)
    s = cache.add_sequence()[0]
    model.add(s)
    model.append(s, 3, layers=range(1))  # layer 0 runs ahead and allocates
    assert (cache.length(s, 0), cache.length(s, 1), cache.length(s)) == (3, 0, 0)
    table = cache.block_table(s)
    model.append(s, 3, layers=range(1, 2))
    assert cache.block_table(s) == table  # layer 1 wrote into the same block
    model.check([s], t_q=3)


@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")  # inductor's
def test_flex_paged_attention_reference() -> None:
    """Equal to torch's experimental PagedAttention + compiled flex_attention (inference).

    Torch's page table is set to this cache's (non-contiguous) block tables, its `assign`
    writes the same keys through it, and its pools must then equal ours.
    """
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    cache = _cache(num_blocks=16, num_layers=1)
    model = _Model(cache)
    lengths = [6, 11, 8]
    seqs = [cache.add_sequence()[0] for _ in lengths]
    for s in seqs:
        model.add(s)
    for step in range(max(lengths)):  # one token at a time, round robin: interleaved
        for s, n in zip(seqs, lengths, strict=True):
            if step < n:
                model.append(s, 1)
    tables = cache.block_tables(seqs)  # (b, max_blocks)
    assert tables[0].tolist() != sorted(tables[0].tolist()) or tables[0, 1] != tables[0, 0] + 1
    b, max_blocks = tables.shape
    paged = PagedAttention(cache.num_blocks, BS, b, device="cpu")
    paged.page_table[:, :max_blocks] = tables
    for i, s in enumerate(seqs):
        used = len(cache.block_table(s))
        paged.physical_to_logical[i, tables[i, :used]] = torch.arange(used)
    k_cache = torch.zeros(1, KV, cache.num_blocks * BS, HD)
    v_cache = torch.zeros(1, KV, cache.num_blocks * BS, HD_V)
    for i, (s, n) in enumerate(zip(seqs, lengths, strict=True)):
        k, v = model.keys[s][0][None], model.values[s][0][None]  # (1, kv, n, hd)
        positions = torch.arange(n)[None]  # (1, n)
        paged.assign(torch.tensor([i]), positions, k, v, k_cache, v_cache)
    # Torch's layout (1, kv, num_blocks * block_size, hd) holds exactly our pools.
    ours = cache.key_pools[0].reshape(1, KV, -1, HD)  # (1, kv, num_blocks * bs, hd)
    torch.testing.assert_close(k_cache, ours, atol=0, rtol=0)

    t_q, n = 3, torch.tensor(lengths)

    def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return kv_idx <= n[b] - t_q + q_idx  # the last t_q tokens are the queries

    logical = create_block_mask(causal, b, None, t_q, max_blocks * BS, device="cpu", BLOCK_SIZE=BS)
    block_mask = paged.convert_logical_block_mask(logical, kv_len=n)
    q = torch.randn(b, H, t_q, HD)
    flex = torch.compile(flex_attention, dynamic=False)
    with torch.no_grad():
        expected = flex(q, k_cache, v_cache, block_mask=block_mask, enable_gqa=True)
    for method in METHODS:
        out = cache.attend(0, q, seqs, method=method)  # type: ignore[arg-type]
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


# --- properties of sharing ------------------------------------------------------


def _check_invariants(cache: PagedKVCache, family: dict[int, int]) -> None:
    """Reference counts count table entries; a block in two tables is shared legitimately."""
    holders: dict[int, list[int]] = {}
    for s in cache.sequences:
        for block in cache.block_table(s):
            holders.setdefault(block, []).append(s)
    for block in range(cache.num_blocks):
        seqs = holders.get(block, [])
        assert cache.allocator.refcount(block) == len(seqs)
        if len({*seqs}) > 1:  # shared: by a fork (one family) or as a cached prefix
            assert len({family[s] for s in seqs}) == 1 or cache.block_hash(block) is not None
    assert cache.num_free_blocks == cache.num_blocks - len(holders)


def test_random_workload_keeps_sequences_apart_and_frees_every_block() -> None:
    cache = _cache(num_blocks=48)
    model = _Model(cache)
    rng = random.Random(1)
    family: dict[int, int] = {}
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 9, 9, 9, 9, 9, 9], [7] * 13]
    content: dict[str, list[tuple[Tensor, Tensor]]] = {}  # a cached block's keys, per layer
    hits = forks = shared_writes = 0
    for step in range(60):
        live = cache.sequences
        op = rng.choice(["add", "add", "append", "append", "append", "fork", "free"])
        if op == "add" or not live:
            prompt = rng.choice([*prompts, []])
            s, cached = cache.add_sequence(prompt)
            hits += cached > 0
            family[s] = s
            model.add(s)
            for digest in block_hashes(prompt, BS)[: cached // BS]:  # what was cached
                for layer, (k, v) in enumerate(content[digest]):
                    model.keys[s][layer] = torch.cat([model.keys[s][layer], k], dim=1)
                    model.values[s][layer] = torch.cat([model.values[s][layer], v], dim=1)
            if len(prompt) > cached:
                model.append(s, len(prompt) - cached)
        elif op == "append":
            s = rng.choice(live)
            last = cache.block_table(s)[-1:]
            shared_writes += bool(last) and cache.allocator.refcount(last[0]) > 1
            model.append(s, rng.choice([1, 2, 3]))
        elif op == "fork":
            parent = rng.choice(live)
            child = model.fork(parent)
            family[child] = family[parent]
            forks += 1
        else:
            cache.free(rng.choice(live))
        _check_invariants(cache, family)
        for s in cache.sequences:  # remember what each cached block holds
            for i, block in enumerate(cache.block_table(s)):
                digest = cache.block_hash(block)
                if digest is not None:
                    cut = slice(i * BS, (i + 1) * BS)
                    content[digest] = [
                        (model.keys[s][layer][:, cut], model.values[s][layer][:, cut])
                        for layer in range(cache.num_layers)
                    ]
        written = [s for s in cache.sequences if cache.length(s) > 0]
        if step % 6 == 5 and written:
            model.check(written)
    assert hits
    assert forks
    assert shared_writes
    for s in cache.sequences:
        cache.free(s)
    assert cache.num_free_blocks == cache.num_blocks
    assert all(cache.allocator.refcount(b) == 0 for b in range(cache.num_blocks))


def test_copy_on_write_leaves_the_other_sequence_unchanged() -> None:
    cache = _cache()
    model = _Model(cache)
    parent = cache.add_sequence()[0]
    model.add(parent)
    model.append(parent, 6)  # one full block and a shared, partly filled one
    child = model.fork(parent)
    assert cache.block_table(child) == cache.block_table(parent)
    q = torch.randn(1, H, 1, HD)
    before = cache.attend(1, q, [parent])
    free = cache.num_free_blocks
    model.append(child, 1)  # writes into the shared last block: copied first
    assert cache.num_free_blocks == free - 1
    p_table, c_table = cache.block_table(parent), cache.block_table(child)
    assert p_table[0] == c_table[0]
    assert p_table[1] != c_table[1]
    torch.testing.assert_close(cache.attend(1, q, [parent]), before, atol=0, rtol=0)
    model.append(parent, 2)  # the parent now holds its block alone: written in place
    assert cache.block_table(parent) == p_table
    model.check([parent, child])


def test_prefix_sharing_stores_a_shared_prefix_once() -> None:
    cache = _cache(num_blocks=12)
    model = _Model(cache)
    system = list(range(100, 110))  # 10 tokens: two full blocks and a partial one
    first, cached = cache.add_sequence([*system, 1, 2])
    assert cached == 0
    model.add(first)
    model.append(first, 12)
    used = cache.num_blocks - cache.num_free_blocks
    hashes = block_hashes([*system, 1, 2], BS)
    assert [cache.block_hash(b) for b in cache.block_table(first)] == hashes
    others = []
    for tail in ([3], [4, 5, 6, 7, 8]):
        s, cached = cache.add_sequence([*system, *tail])
        assert cached == 8  # the two full blocks of the system prompt
        assert cache.block_table(s) == cache.block_table(first)[:2]
        model.add(s)
        for layer in range(cache.num_layers):
            model.keys[s][layer] = model.keys[first][layer][:, :8]
            model.values[s][layer] = model.values[first][layer][:, :8]
        model.append(s, 2 + len(tail))
        others.append(s)
    # 12 + 3 + 5 tokens in 3 + 1 + 2 blocks: the prefix's 2 blocks are held once.
    assert cache.num_blocks - cache.num_free_blocks == used + 1 + 2
    assert [cache.allocator.refcount(b) for b in cache.block_table(first)[:2]] == [3, 3]
    model.check([first, *others])
    # A prompt that is cached whole still leaves its last token to compute.
    s, cached = cache.add_sequence(system[:8])
    assert cached == 4
    for seq in [first, *others, s]:
        cache.free(seq)
    assert cache.num_free_blocks == cache.num_blocks


def test_freed_prefix_blocks_are_found_again_until_handed_out() -> None:
    cache = _cache(num_blocks=6)
    model = _Model(cache)
    prompt = list(range(9))
    s, _ = cache.add_sequence(prompt)
    model.add(s)
    model.append(s, 9)
    blocks = cache.block_table(s)
    cache.free(s)
    assert cache.num_free_blocks == 6  # free, but still cached
    again, cached = cache.add_sequence(prompt)
    assert (cached, cache.block_table(again)) == (8, blocks[:2])
    q = torch.randn(1, H, 1, HD)
    model.add(again)
    for layer in range(cache.num_layers):
        model.keys[again][layer] = model.keys[s][layer][:, :8]
        model.values[again][layer] = model.values[s][layer][:, :8]
    model.append(again, 1)
    model.check([again])
    cache.free(again)
    # Fill the whole pool with another sequence: every block is handed out again, the
    # hashes go with them, and the prompt is no longer found.
    filler = cache.add_sequence()[0]
    for layer in range(cache.num_layers):
        cache.append(filler, layer, torch.zeros(KV, 24, HD), torch.zeros(KV, 24, HD_V))
    assert all(cache.block_hash(b) is None for b in range(6))
    cache.free(filler)
    assert cache.add_sequence(prompt)[1] == 0
    del q


def test_block_hashes_chain_sha256_of_the_tokens() -> None:
    import hashlib

    def digest(parent: bytes, tokens: list[int]) -> tuple[bytes, str]:
        data = b"".join(t.to_bytes(8, "little", signed=True) for t in tokens)
        h = hashlib.sha256(parent + data)
        return h.digest(), h.hexdigest()

    first, first_hex = digest(b"", [3, -1])
    _, second_hex = digest(first, [7, 2**40])
    assert block_hashes([3, -1, 7, 2**40, 5], 2) == [first_hex, second_hex]
    assert block_hashes(torch.tensor([3, -1, 7]), 2) == [first_hex]
    assert block_hashes([1], 2) == []


def test_prefix_caching_can_be_turned_off() -> None:
    cache = _cache(prefix_caching=False)
    prompt = torch.arange(9)
    first, _ = cache.add_sequence(prompt)
    for layer in range(cache.num_layers):
        cache.append(first, layer, torch.randn(KV, 9, HD), torch.randn(KV, 9, HD_V))
    second, cached = cache.add_sequence(prompt)
    assert cached == 0
    assert cache.block_table(second) == []
    assert all(cache.block_hash(b) is None for b in cache.block_table(first))


# --- bad input ------------------------------------------------------------------


def test_allocator_errors() -> None:
    pool = BlockAllocator(3)
    pool.allocate(2)
    with pytest.raises(OutOfBlocksError, match="2 requested but only 1 free") as info:
        pool.allocate(2)
    assert (info.value.requested, info.value.free, pool.num_free_blocks) == (2, 1, 1)
    pool.free(0)
    with pytest.raises(ValueError, match="block_id 0 is already free"):
        pool.free(0)
    with pytest.raises(ValueError, match=re.escape("block_id must be in [0, 3)")):
        pool.free(3)
    with pytest.raises(ValueError, match=re.escape("block_id must be in [0, 3)")):
        pool.incref(-1)
    with pytest.raises(TypeError, match="block_id must be an int"):
        pool.free(1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_id 0 is free"):
        pool.incref(0)
    with pytest.raises(ValueError, match="block_id 1 is in use"):
        pool.take(1)
    for bad, error in ((0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="num_blocks must be a positive int"):
            BlockAllocator(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("bad", "error"), [(0, ValueError), (-4, ValueError), (4.0, TypeError)])
def test_block_size_must_be_a_positive_int(bad: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="block_size must be a positive int"):
        PagedKVCache(num_layers=1, num_blocks=4, block_size=bad, num_kv_heads=1, head_dim=2)  # type: ignore[arg-type]
    with pytest.raises(error, match="block_size must be a positive int"):
        block_hashes([1, 2], bad)  # type: ignore[arg-type]


def test_out_of_blocks_raises_and_writes_nothing() -> None:
    cache = _cache(num_blocks=3, num_layers=1)
    a = cache.add_sequence()[0]
    cache.append(a, 0, torch.randn(KV, 6, HD), torch.randn(KV, 6, HD_V))  # 2 blocks
    b = cache.fork(a)
    pools = cache.key_pools.clone(), cache.value_pools.clone()
    tables = cache.block_table(a), cache.block_table(b)
    # 7 tokens more: the shared block to copy plus 2 new ones, 1 free.
    with pytest.raises(OutOfBlocksError, match="3 requested but only 1 free"):
        cache.append(b, 0, torch.randn(KV, 7, HD), torch.randn(KV, 7, HD_V))
    assert (cache.block_table(a), cache.block_table(b)) == tables
    assert cache.length(b) == 6
    assert cache.num_free_blocks == 1
    torch.testing.assert_close(cache.key_pools, pools[0], atol=0, rtol=0)
    torch.testing.assert_close(cache.value_pools, pools[1], atol=0, rtol=0)


def test_cache_errors_name_the_argument() -> None:
    cache = _cache(num_blocks=4)
    s = cache.add_sequence()[0]
    k, v = torch.randn(KV, 2, HD), torch.randn(KV, 2, HD_V)
    cache.free(s)
    with pytest.raises(ValueError, match="seq_id 0 was freed already"):
        cache.free(s)
    with pytest.raises(ValueError, match="seq_id 0 was freed already"):
        cache.append(s, 0, k, v)
    with pytest.raises(ValueError, match="seq_id 7 is not a sequence of this cache"):
        cache.fork(7)
    with pytest.raises(TypeError, match="seq_id must be an int"):
        cache.block_table("0")  # type: ignore[arg-type]
    s = cache.add_sequence()[0]
    with pytest.raises(ValueError, match=re.escape("layer must be in [0, 2)")):
        cache.append(s, 2, k, v)
    with pytest.raises(ValueError, match=re.escape("layer must be in [0, 2)")):
        cache.attend(5, torch.randn(1, H, 1, HD), [s])
    cache.append(s, 0, k[:, :0], v[:, :0])  # no tokens: nothing to allocate
    with pytest.raises(ValueError, match=re.escape("key must have shape (num_kv_heads=2, t, 5)")):
        cache.append(s, 0, torch.randn(3, 2, HD), v)
    with pytest.raises(ValueError, match=re.escape("value must have shape (num_kv_heads=2, t, 3)")):
        cache.append(s, 0, k, torch.randn(KV, 2, HD))
    with pytest.raises(ValueError, match="key must have 3 dimensions"):
        cache.append(s, 0, k[None], v)
    with pytest.raises(ValueError, match="same number of tokens"):
        cache.append(s, 0, k, v[:, :1])
    with pytest.raises(
        ValueError, match=re.escape("key is torch.float64 on cpu but the cache holds")
    ):
        cache.append(s, 0, k.double(), v)
    with pytest.raises(TypeError, match="key must have a floating-point dtype"):
        cache.append(s, 0, k.long(), v)
    with pytest.raises(ValueError, match="token_ids has 17 tokens but the cache holds at most 16"):
        cache.add_sequence(list(range(17)))
    with pytest.raises(TypeError, match=re.escape("token_ids[1] must be an int")):
        cache.add_sequence([1, 2.0])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="token_ids must be a 1-d integer tensor"):
        cache.add_sequence(torch.tensor([True, False]))  # bool is no token id
    with pytest.raises(TypeError, match="token_ids must be a 1-d integer tensor"):
        block_hashes(torch.tensor([[1, 2]]), 2)
    with pytest.raises(TypeError, match=re.escape("dtype must be a floating-point torch.dtype")):
        _cache(dtype=torch.int64)
    with pytest.raises(TypeError, match=re.escape("prefix_caching must be a bool, got 1 (int)")):
        _cache(prefix_caching=1)
    assert cache.length(s) == 0
    assert cache.num_free_blocks == 4


def _attention_args() -> dict[str, Tensor]:
    return {
        "query": torch.randn(2, H, 1, HD),
        "key_pool": torch.randn(KV, 8, BS, HD),
        "value_pool": torch.randn(KV, 8, BS, HD_V),
        "block_tables": torch.tensor([[0, 1], [2, 3]]),
        "lengths": torch.tensor([5, 8]),
    }


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"query": torch.randn(2, 5, 1, HD)}, ValueError, "num_heads=5 must be a multiple of"),
        ({"query": torch.randn(2, H, HD)}, ValueError, "query must have 4 dimensions"),
        ({"query": torch.randn(2, H, 1, 4)}, ValueError, "key_pool has 5 features"),
        ({"query": torch.randn(2, H, 1, HD).double()}, ValueError, "dtype"),
        ({"value_pool": torch.randn(KV, 8, 2, HD_V)}, ValueError, "key_pool and value_pool"),
        ({"key_pool": torch.ones(KV, 8, BS, HD, dtype=torch.long)}, TypeError, "key_pool must"),
        ({"block_tables": torch.zeros(2, 2)}, TypeError, "block_tables must be an integer"),
        ({"block_tables": torch.tensor([0, 1])}, ValueError, "block_tables must have 2 dim"),
        ({"block_tables": torch.tensor([[0, 1]])}, ValueError, "block_tables has 1 rows"),
        ({"block_tables": torch.tensor([[0, 1], [2, 8]])}, ValueError, "block ids in"),
        ({"block_tables": torch.zeros(2, 0, dtype=torch.long)}, ValueError, "one column"),
        ({"lengths": torch.tensor([5, 9])}, ValueError, "lengths must be in"),
        ({"lengths": torch.tensor([5, 0])}, ValueError, "t_q=1 queries"),
        ({"lengths": [5, 8]}, TypeError, "lengths must be an integer tensor (b,), got list"),
        ({"query_lengths": torch.tensor([1, 2])}, ValueError, "query_lengths must be in"),
        ({"query_lengths": torch.tensor([1])}, ValueError, "query_lengths has 1 rows"),
        ({"method": "paged"}, ValueError, "method"),
        ({"backend": "flash"}, ValueError, "backend"),
        ({"blocks_per_tile": 0}, ValueError, "blocks_per_tile must be a positive int"),
        ({"scale": float("nan")}, ValueError, "scale must be finite"),
    ],
)
def test_paged_attention_bad_input(
    change: dict[str, object], error: type[Exception], message: str
) -> None:
    args: dict[str, object] = {**_attention_args(), **change}
    with pytest.raises(error, match=re.escape(message)):
        paged_attention(**args)  # type: ignore[arg-type]


def test_paged_attention_checks_can_be_switched_off() -> None:
    args = _attention_args()
    with validation(False):
        out = paged_attention(**args)  # type: ignore[arg-type]
    torch.testing.assert_close(out, paged_attention(**args))  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["torch", "scratch"])
@pytest.mark.parametrize("method", ["online", "gather"])
def test_paged_attention_follows_autocast_like_the_other_kernels(
    method: Method, backend: Backend
) -> None:
    # torch.autocast casts attention's inputs to bfloat16 and returns bfloat16, whatever
    # the method: the rule of PyTorch's SDPA and of attnlab's own kernels.
    from attnlab.functional.sdpa import scaled_dot_product_attention

    torch.manual_seed(0)
    k_pool, v_pool = torch.randn(2, 6, 4, 8), torch.randn(2, 6, 4, 8)  # 6 blocks of 4
    tables = torch.tensor([[5, 2, 0], [1, 4, 3]])
    lengths = torch.tensor([7, 12])
    q = torch.randn(2, 4, 2, 8)  # 4 query heads share 2 kv heads; 2 new tokens each

    def run(query: Tensor, keys: Tensor, values: Tensor) -> Tensor:
        return paged_attention(
            query, keys, values, tables, lengths, method=method, backend=backend, blocks_per_tile=1
        )

    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = run(q, k_pool, v_pool)
        mixed = run(q.bfloat16(), k_pool, v_pool)  # a projection's bfloat16, float32 pools
    assert got.dtype == mixed.dtype == torch.bfloat16
    low = [t.bfloat16() for t in (q, k_pool, v_pool)]
    outside = run(*low)
    assert torch.equal(got, outside)  # autocast = the inputs cast, then run as written
    assert torch.equal(mixed, outside)
    for i, n in enumerate(lengths.tolist()):
        keys = k_pool[:, tables[i]].reshape(2, 12, 8)[:, :n].repeat_interleave(2, dim=0)
        values = v_pool[:, tables[i]].reshape(2, 12, 8)[:, :n].repeat_interleave(2, dim=0)
        seen = torch.arange(n)[None, :] <= torch.arange(n - 2, n)[:, None]  # (2, n)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours = scaled_dot_product_attention(q[i], keys, values, attn_mask=seen)
            torch_ = F.scaled_dot_product_attention(q[i], keys, values, attn_mask=seen)
        assert ours.dtype == torch_.dtype == torch.bfloat16
        torch.testing.assert_close(got[i], ours, atol=8e-3, rtol=8e-3)
        torch.testing.assert_close(got[i], torch_, atol=8e-3, rtol=8e-3)


@pytest.mark.parametrize("method", ["online", "gather"])
def test_paged_attention_of_zero_features_averages_the_values(method: str) -> None:
    """E = 0: every score is 0, so each query averages the values it sees, as the other
    kernels do (the default scale 1/sqrt(E) used to raise ZeroDivisionError here)."""
    v_pool = torch.randn(KV, 8, BS, HD_V)
    k_pool = torch.randn(KV, 8, BS, 0)
    tables = torch.arange(8).reshape(2, 4)
    lengths = torch.tensor([5, 3])
    q = torch.randn(2, H, 1, 0)  # one decoded query per sequence
    out = paged_attention(q, k_pool, v_pool, tables, lengths, method=method)  # type: ignore[arg-type]
    for b, n in enumerate(lengths.tolist()):
        v = _contiguous(v_pool, tables[b].tolist(), n)  # (KV, n, HD_V)
        expected = v.mean(dim=-2).repeat_interleave(H // KV, dim=0)  # (H, HD_V)
        torch.testing.assert_close(out[b, :, 0], expected)


def test_truncate_takes_back_tokens_and_frees_their_blocks() -> None:
    """What a speculative step's rejected drafts need: the tokens go in every layer, the
    blocks past them are free, and a later append writes where they were; a registered
    prompt block cut into leaves the prefix cache until it is written again."""
    cache = PagedKVCache(num_layers=2, num_blocks=6, block_size=4, num_kv_heads=1, head_dim=2)
    seq, _ = cache.add_sequence([1, 2, 3, 4, 5])  # one full prompt block, registered
    k = torch.arange(22.0).view(1, 11, 2)
    for layer in (0, 1):
        cache.append(seq, layer, k, k)  # 11 tokens: blocks 0, 1, 2
    cache.truncate(seq, 6)
    assert [cache.length(seq, 0), cache.length(seq, 1)] == [6, 6]
    assert cache.block_table(seq) == [0, 1]
    assert cache.num_free_blocks == 4
    cache.append(seq, 0, -k[:, :3], -k[:, :3])
    table = cache.block_tables([seq])
    keys = cache.key_pools[0][:, table[0]].reshape(1, 12, 2)[:, :9]
    assert torch.equal(keys, torch.cat([k[:, :6], -k[:, :3]], 1))
    with pytest.raises(ValueError, match=r"length must be an int in \[0, 9\]"):
        cache.truncate(seq, 10)
    assert cache.block_hash(0) is not None  # the prompt block is cached
    cache.truncate(seq, 3)  # into it: it will be written again, so it leaves the cache
    assert cache.block_hash(0) is None
    assert cache.add_sequence([1, 2, 3, 4, 5])[1] == 0  # a new prompt finds nothing
    for layer in (0, 1):
        cache.append(seq, layer, k[:, 3:5], k[:, 3:5])  # the same tokens again
    assert cache.block_hash(0) is not None  # registered anew once every layer has them


@pytest.mark.parametrize("method", ["online", "gather"])
def test_paged_attention_with_a_tree_mask_equals_sdpa(method: Method) -> None:
    """Draft trees verified in one pass through the block tables: each sequence's new
    tokens see the cached ones and, among themselves, what their tree mask allows; equal
    to SDPA over the contiguous keys with the dense mask (prompt columns all True), for
    sequences of different cached lengths, GQA, and a padded shorter tree."""
    from attnlab.models.speculative import tree_mask

    torch.manual_seed(0)
    kv, g, e, bs, t_q = 2, 3, 8, 4, 5
    trees = [[-1, 0, -1, 2], [-1, -1, 1, 1], [-1]]  # 5, 5 and 2 new tokens (root first)
    past = [6, 9, 3]
    news = [len(p) + 1 for p in trees]
    lengths = torch.tensor([p + n for p, n in zip(past, news, strict=True)])
    k_pool, v_pool = torch.randn(kv, 16, bs, e), torch.randn(kv, 16, bs, e)
    tables = torch.randperm(16)[:12].view(3, 4)
    masks = torch.zeros(3, t_q, t_q, dtype=torch.bool)
    masks[:] = torch.eye(t_q, dtype=torch.bool)  # padding rows see themselves
    for row, parents in enumerate(trees):
        masks[row, : news[row], : news[row]] = tree_mask(parents)
    query = torch.randn(3, kv * g, t_q, e)
    out = paged_attention(query, k_pool, v_pool, tables, lengths, method=method,
                          query_lengths=torch.tensor(news), tree_mask=masks)  # fmt: skip
    for row in range(3):
        n, length = news[row], int(lengths[row])
        keys = k_pool[:, tables[row]].reshape(kv, -1, e)[:, :length]  # (kv, length, e)
        values = v_pool[:, tables[row]].reshape(kv, -1, e)[:, :length]
        dense = torch.cat([torch.ones(n, past[row], dtype=torch.bool), tree_mask(trees[row])], 1)
        want = F.scaled_dot_product_attention(
            query[row, :, :n], keys, values, attn_mask=dense, enable_gqa=True
        )
        torch.testing.assert_close(out[row, :, :n], want)
    causal = paged_attention(query, k_pool, v_pool, tables, lengths, method=method,
                             query_lengths=torch.tensor(news))  # fmt: skip
    torch.testing.assert_close(causal[0, :, :3], out[0, :, :3])  # a chain so far
    assert not torch.allclose(causal[0, :, 3], out[0, :, 3])  # a second branch's first node
    with pytest.raises(ValueError, match=r"tree_mask must be a bool tensor \(b, t_q, t_q\)"):
        paged_attention(query, k_pool, v_pool, tables, lengths, tree_mask=masks[:2])
    with pytest.raises(ValueError, match="tree_mask must let each new token see itself"):
        paged_attention(query, k_pool, v_pool, tables, lengths, tree_mask=~masks)
