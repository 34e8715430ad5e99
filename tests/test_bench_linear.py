"""The linear-attention decode benchmark's harness, on tiny settings: the three models
are the stacks it names, the bytes it reports are the bytes computed by hand, and a step
it times continues the prefill it ran as one pass over the whole sequence would. No
timing is asserted."""

from __future__ import annotations

import pytest
import torch

from attnlab.caches.kv import DynamicKVCache
from attnlab.models.decoder import Decoder
from attnlab.tools.bench.linear import (
    MODELS,
    LinearSettings,
    cache_bytes,
    decoder_config,
    main,
    measure_linear,
)

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = LinearSettings(
    contexts=(6, 20),
    num_layers=4,
    d_model=16,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    linear_k_heads=2,
    linear_v_heads=4,
    linear_head_dim=3,
    hidden_dim=24,
    vocab_size=50,
    rounds=2,
)


def test_models_are_the_named_stacks() -> None:
    kinds = {name: decoder_config(name, TINY).layer_kinds for name in MODELS}
    assert kinds == {
        "softmax": ("full",) * 4,
        "linear": ("linear",) * 4,
        "hybrid": ("linear", "linear", "linear", "full"),
    }
    assert decoder_config("hybrid", TINY).rope_dims == 2


def test_cache_bytes_equal_hand_counts() -> None:
    # A full layer: keys and values of 2 heads of 8 float32 per token; a linear layer:
    # a conv state of (2 * 2 * 3 + 4 * 3) channels by 3 taps and 4 heads of 3 x 3.
    kv_per_token = 2 * 2 * 8 * 4
    state = (24 * 3 + 4 * 3 * 3) * 4
    for name, expected in (
        ("softmax", 4 * kv_per_token * 20),
        ("linear", 4 * state),
        ("hybrid", 3 * state + kv_per_token * 20),
    ):
        model = Decoder(decoder_config(name, TINY))
        assert cache_bytes(model.make_cache(1, 24), 20) == expected
    # Any cache of the protocol counts; a dynamic one what it holds.
    filled = DynamicKVCache()
    filled.update(torch.zeros(1, 2, 20, 8), torch.zeros(1, 2, 20, 8))
    assert cache_bytes([filled], 20) == kv_per_token * 20
    with pytest.raises(TypeError, match=r"caches\[1\] must be a LayerCache, got dict"):
        cache_bytes([filled, {}], 20)


def test_record_holds_every_model_at_every_context() -> None:
    data = measure_linear(TINY, command="test")
    assert data["provenance"]["command"] == "test"
    assert data["provenance"]["load_average_before"] is not None
    assert [case["context"] for case in data["cases"]] == [6, 20]
    first, second = data["cases"]
    for name in MODELS:  # one timing per round, each of them positive
        times = first["time_s"][name]
        assert 0 < times["min"] <= times["median"] <= times["max"]
    # The state does not grow; the caches of the attention layers do, by the context.
    assert first["cache_bytes"]["linear"] == second["cache_bytes"]["linear"]
    assert second["bytes_per_token"]["softmax"] == first["bytes_per_token"]["softmax"] == 4 * 128
    assert set(first["over_softmax"]) == {"linear", "hybrid"}
    counts = {
        n: sum(p.numel() for p in Decoder(decoder_config(n, TINY)).parameters()) for n in MODELS
    }
    assert data["parameters"] == counts


def test_timed_step_continues_the_prefill() -> None:
    # The benchmark's calls: prefill the context, then one token from the caches; its
    # logits equal one uncached pass over the context and the token.
    model = Decoder(decoder_config("hybrid", TINY)).eval()
    ids = torch.randint(0, 50, (1, 12))
    caches = model.make_cache(1, 16)
    with torch.no_grad():
        model(ids[:, :11], cache=caches, last_only=True)
        step = model(ids[:, 11:], cache=caches, last_only=True)
        whole = model(ids)
    torch.testing.assert_close(step[:, 0], whole[:, -1], atol=1e-5, rtol=1e-5)


def test_settings_and_command_line_name_bad_values(tmp_path: object) -> None:
    with pytest.raises(ValueError, match="num_layers must be a multiple of 4"):
        LinearSettings(num_layers=6)
    with pytest.raises(ValueError, match="contexts must be positive ints"):
        LinearSettings(contexts=(0,))
    with pytest.raises(ValueError, match="model must be one of"):
        decoder_config("mamba", TINY)
    with pytest.raises(SystemExit):
        main(["--rounds", "x"])
