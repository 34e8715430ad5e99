"""The model view's data: every head's weights from the log-sum-exp, encoded, decoded back.

A small random `Decoder` stands in for SmolLM2 here (tests/test_site.py checks the real
page against the real model); `decode` below reads the encoding as `model_view.js` does,
from the module docstring, so a change of either side that the other does not follow
fails.
"""

from __future__ import annotations

import base64
import json
import math
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from attnlab.models.config import DecoderConfig, LinearAttentionConfig
from attnlab.models.decoder import Decoder
from attnlab.tools import model_view as mv

STEP = 1 / 510 + 1e-6  # a byte per weight, rounded: half a step of 1/255


class CharTokenizer:
    """One token per character, ids from 1 (the tiny model's vocabulary is 61)."""

    def encode(self, text: str) -> list[int]:
        return [1 + (ord(c) % 60) for c in text]

    def decode(self, ids: int | list[int]) -> str:
        return "".join(chr(96 + i % 27) for i in ([ids] if isinstance(ids, int) else ids))


@pytest.fixture(scope="module")
def decoder() -> Decoder:
    torch.manual_seed(1)
    config = DecoderConfig(
        vocab_size=61, d_model=24, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=6,
        hidden_dim=40, windows=(None, 5, None),
    )  # fmt: skip
    model = Decoder(config).eval()
    with torch.no_grad():  # sharper weights than the random initialisation's
        for block in model.layers:
            block.self_attn.q_proj.weight.mul_(6.0)
    return model


def decode(entry: dict[str, Any]) -> dict[str, Tensor]:
    """The arrays of an entry, read as model-view.js reads them (weights in [0, 1])."""
    raw = zlib.decompress(base64.b64decode(entry["data"]))
    heads, t, k, cells = entry["layers"] * entry["heads"], entry["t"], entry["k"], entry["cells"]
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
    shape = (entry["layers"], entry["heads"])
    at = heads * cells * cells if entry["thumbs"] else 0
    out = {}
    if entry["mode"] == "full":
        rows, cols = torch.tril_indices(t, t)
        square = torch.zeros(heads, t, t, dtype=torch.long)
        square[:, rows, cols] = data[at:].reshape(heads, -1)
        assert data.numel() == at + heads * len(rows)
        out["weights"] = square.reshape(*shape, t, t) / 255
    else:
        n = heads * t * k
        assert data.numel() == at + 3 * n
        steps = data[at : at + n] | data[at + n : at + 2 * n] << 8
        keys = steps.reshape(*shape, t, k).cumsum(-1)
        values = data[at + 2 * n :].reshape(*shape, t, k) / 255
        out["weights"] = torch.zeros(*shape, t, t).scatter_(-1, keys, values)
        out["keys"] = keys
    thumbs = data[:at].reshape(*shape, cells, cells) / 255 if entry["thumbs"] else out["weights"]
    out["thumbs"] = thumbs
    return out


def test_model_view_weights_equal_the_decoders_materialised_softmax(
    decoder: Decoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    import attnlab.layers.gqa as gqa

    ids = torch.tensor(CharTokenizer().encode("the cat sat on the mat; the cat"))
    backends = [block.self_attn.backend for block in decoder.layers]
    calls: list[int] = []
    real = gqa.weights_from_rule
    monkeypatch.setattr(gqa, "weights_from_rule", lambda *a, **k: calls.append(1) or real(*a, **k))
    recovered = mv.attention_weights(decoder, ids)  # on flash, from the log-sum-exp
    assert len(calls) == 3  # every layer's weights came from its log-sum-exp
    assert [block.self_attn.backend for block in decoder.layers] == backends  # restored
    softmax = torch.stack(decoder.attention_maps(ids))  # from scratch, materialised
    assert len(calls) == 3
    assert recovered.shape == (3, 4, len(ids), len(ids))
    torch.testing.assert_close(recovered, softmax, atol=1e-6, rtol=0)


def test_short_texts_keep_every_weight_and_long_ones_the_top_k(decoder: Decoder) -> None:
    tokenizer = CharTokenizer()
    texts = {"short": "a cat sat", "long": "the cat sat on the mat, and the dog sat on the log"}
    view = mv.model_view(decoder, tokenizer, texts, top_k=3, full_up_to=16, thumb=8)
    short, long = view.texts
    assert (short["mode"], short["t"], short["pool"], short["thumbs"]) == ("full", 9, 2, True)
    assert (long["mode"], long["k"], long["t"], long["pool"], long["cells"]) == ("top", 3, 50, 7, 8)
    assert long["tokens"] == [tokenizer.decode(i) for i in tokenizer.encode(texts["long"])]
    for entry, text in zip(view.texts, texts.values(), strict=True):
        maps = mv.attention_weights(decoder, torch.tensor(tokenizer.encode(text)))
        got, t = decode(entry), entry["t"]
        pool, cells = entry["pool"], entry["cells"]
        padded = torch.zeros(3, 4, cells * pool, cells * pool)
        padded[..., :t, :t] = maps
        pooled = padded.reshape(3, 4, cells, pool, cells, pool).amax(dim=(3, 5))
        torch.testing.assert_close(got["thumbs"], pooled, atol=STEP, rtol=0)
        if entry["mode"] == "full":
            torch.testing.assert_close(got["weights"], maps, atol=STEP, rtol=0)
            continue
        # The kept keys are each row's largest, sorted, and their weights are the model's.
        kept = maps.gather(-1, got["keys"])
        torch.testing.assert_close(got["weights"].gather(-1, got["keys"]), kept, atol=STEP, rtol=0)
        assert bool((got["keys"].diff(dim=-1) > 0).all())
        smallest_kept = kept.amin(dim=-1, keepdim=True)
        others = maps.scatter(-1, got["keys"], 0.0)
        assert bool((others <= smallest_kept + 1e-7).all())
        # A row's rest is one mass: 1 minus what is kept, within k steps.
        rest = 1 - got["weights"].sum(-1)
        torch.testing.assert_close(rest, others.sum(-1), atol=3 * STEP, rtol=0)


def test_thumbnails_of_whole_tokens_come_from_the_full_maps(decoder: Decoder) -> None:
    view = mv.model_view(decoder, CharTokenizer(), ["abcdef"], thumb=32)
    (entry,) = view.texts
    assert (entry["pool"], entry["thumbs"], entry["name"]) == (1, False, "abcdef")
    raw = zlib.decompress(base64.b64decode(entry["data"]))
    assert len(raw) == 3 * 4 * 6 * 7 // 2  # the lower triangles only


def test_the_cache_keeps_the_data_under_the_weights_texts_and_source(
    decoder: Decoder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    tokenizer = CharTokenizer()
    first = mv.model_view(decoder, tokenizer, "a cat", cache_key="weights-1")
    (file,) = (tmp_path / "model-view").glob("*.json")
    assert json.loads(file.read_text("utf-8")) == list(first.texts)

    def unused(*args: object) -> Tensor:
        raise AssertionError("computed again")

    monkeypatch.setattr(mv, "attention_weights", unused)
    assert mv.model_view(decoder, tokenizer, "a cat", cache_key="weights-1") == first
    changes: list[tuple[str, dict[str, Any]]] = [
        ("a dog", {}),
        ("a cat", {"cache_key": "weights-2"}),
        ("a cat", {"top_k": 2}),
        ("a cat", {"thumb": 3}),
    ]
    for text, change in changes:
        with pytest.raises(AssertionError, match="computed again"):
            mv.model_view(decoder, tokenizer, text, **{"cache_key": "weights-1", **change})

    class Other(CharTokenizer):  # the same ids, other texts for them
        def decode(self, ids: int | list[int]) -> str:
            return "?"

    with pytest.raises(AssertionError, match="computed again"):
        mv.model_view(decoder, Other(), "a cat", cache_key="weights-1")
    monkeypatch.setattr(mv, "_source_digest", lambda: "edited")
    with pytest.raises(AssertionError, match="computed again"):
        mv.model_view(decoder, tokenizer, "a cat", cache_key="weights-1")


def test_markup_and_standalone_file_cannot_end_their_script_early(
    decoder: Decoder, tmp_path: Path
) -> None:
    class Tricky(CharTokenizer):
        def decode(self, ids: int | list[int]) -> str:
            return "</script><b>"

    view = mv.model_view(decoder, Tricky(), {"a </script> name": "abc"})
    markup = view.html()
    assert "<" not in markup.split('class="attn-mv-data">')[1].split("</script>")[0]
    assert markup.count("</script>") == 1
    assert markup.endswith("</script></div>")
    assert "a &lt;/script&gt; name" in markup  # the fallback line, escaped
    page = view.save(tmp_path / "view.html").read_text("utf-8")
    assert page.count("</script>") == 2  # the data's, the script's
    assert "attnModelView" in page
    assert "DecompressionStream" in page
    assert view.nbytes == len(markup.split('class="attn-mv-data">')[1].split("</script>")[0])
    assert view._repr_html_().startswith('<iframe srcdoc="&lt;!doctype html&gt;')


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"texts": "x" * (mv.MAX_TOKENS + 1)}, ValueError, r"texts\['x+'\] has 513 tokens"),
        ({"texts": {"empty": ""}}, ValueError, r"texts\['empty'\] has 0 tokens; .* 1 to 512"),
        ({"texts": 3}, TypeError, r"texts must be a str, a sequence of str or a mapping"),
        ({"texts": "ab", "top_k": 0}, ValueError, r"top_k"),
        ({"texts": "ab", "thumb": 2.5}, TypeError, r"thumb"),
        ({"texts": []}, ValueError, r"texts is empty"),
        ({"texts": {"ids": [1.7, 2.2]}}, TypeError, r"texts\['ids'\]"),
        ({"texts": {"ids": [1, 61]}}, ValueError, r"texts\['ids'\]"),
        ({"texts": {"ids": 5}}, TypeError, r"texts\['ids'\]"),
    ],
)
def test_bad_input_names_the_argument(
    decoder: Decoder, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        mv.model_view(decoder, CharTokenizer(), **kwargs)


def test_a_model_without_attention_weights_is_refused(decoder: Decoder) -> None:
    with pytest.raises(TypeError, match=r"decoder must be an attnlab Decoder, got Linear"):
        mv.model_view(torch.nn.Linear(2, 2), CharTokenizer(), "ab")  # type: ignore[arg-type]
    config = DecoderConfig(
        vocab_size=61, d_model=24, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=6,
        hidden_dim=40, layer_kinds=("linear", "full"),
        linear=LinearAttentionConfig(2, 4, 3, 5, kernel_size=3, chunk_size=4),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"linear-attention or MLA layers has no attention maps"):
        mv.model_view(Decoder(config), CharTokenizer(), "ab")


def test_pooling_sizes() -> None:
    for t, thumb in ((7, 32), (33, 32), (256, 32), (512, 32), (50, 8)):
        pool = math.ceil(t / thumb)
        entry = mv.encode(torch.zeros(1, 1, t, t), "x", ["a"] * t, kv_heads=1, thumb=thumb)
        assert (entry["pool"], entry["cells"]) == (pool, math.ceil(t / pool))
        assert entry["cells"] <= thumb


def test_texts_are_named_by_their_start(decoder: Decoder) -> None:
    view = mv.model_view(decoder, CharTokenizer(), ["x" * 50, "x" * 45, "ab"])
    assert [e["name"] for e in view.texts] == ["x" * 40, "x" * 40 + " (2)", "ab"]
    assert [e["ids"] for e in view.texts][2] == CharTokenizer().encode("ab")


@pytest.mark.parametrize("floats", [10**9, 2 * 3 * 4 * 40 * 40])  # all in one pass; two passes
def test_texts_padded_into_one_batch_keep_their_own_weights(
    decoder: Decoder, floats: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mv, "_BATCH_FLOATS", floats)
    texts = [[5, 9, 2], list(range(1, 41)), [7] * 12]
    calls = []
    real = mv.attention_weights
    monkeypatch.setattr(
        mv, "attention_weights", lambda d, ids: calls.append(ids.shape) or real(d, ids)
    )
    maps = list(mv._all_maps(decoder, texts))
    assert calls == ([(3, 40)] if floats > 10**6 else [(2, 40), (1, 12)])
    for text, got in zip(texts, maps, strict=True):
        torch.testing.assert_close(got, real(decoder, torch.tensor(text)), atol=1e-6, rtol=0)


def test_ids_as_a_tokenizers_batch_of_one(decoder: Decoder) -> None:
    view = mv.model_view(decoder, CharTokenizer(), {"ids": torch.tensor([[3, 4, 5]])})
    assert view.texts[0]["ids"] == [3, 4, 5]


def test_encode_checks_its_input() -> None:
    maps = torch.zeros(2, 4, 5, 5)
    with pytest.raises(ValueError, match=r"maps must be \(layers, heads, t, t\), got \(2, 4, 5\)"):
        mv.encode(maps[..., 0], "x", ["a"] * 5, kv_heads=2)
    with pytest.raises(ValueError, match=r"labels has 4 entries for 5 tokens"):
        mv.encode(maps, "x", ["a"] * 4, kv_heads=2)
    with pytest.raises(ValueError, match=r"kv_heads=3 must divide the 4 heads"):
        mv.encode(maps, "x", ["a"] * 5, kv_heads=3)
    with pytest.raises(ValueError, match=r"top_k"):
        mv.encode(maps, "x", ["a"] * 5, kv_heads=2, top_k=0)


def test_layers_with_other_key_value_heads_are_refused() -> None:
    from attnlab.models.config import GlobalAttentionConfig

    config = DecoderConfig(
        vocab_size=61, d_model=24, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=6,
        hidden_dim=40, windows=(3, None), global_attention=GlobalAttentionConfig(8, 1),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"layers have \[1, 2\] key/value heads"):
        mv.model_view(Decoder(config), CharTokenizer(), "ab")
