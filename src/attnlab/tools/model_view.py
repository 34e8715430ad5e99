r"""Every head of a decoder at once: a model view, for a page, a file or a notebook.

bertviz (Vig, 2019, https://arxiv.org/abs/1906.05714) drew every head of BERT and GPT-2 as
small squares and one head at a time as lines between tokens. This module computes
what such a view needs from attnlab's own
[`Decoder`][attnlab.models.decoder.Decoder] and encodes it compactly; the site's script
`model-view.js` draws it:

- a grid of thumbnails, one per layer and query head, the query heads grouped under the
  key/value head they share (grouped-query attention);
- for a head that is clicked (tapped, or chosen with the keyboard), its large view: lines
  from each token to the tokens it attends to, and its heatmap;
- a token strip: pointing at a token lights its row in every thumbnail at once.

The weights come from the model's attention run on attnlab's FlashAttention and are
recovered from each row's log-sum-exp
([`weights_from_lse`][attnlab.functional.lse_weights.weights_from_lse]): the kernel never
writes the $t \times t$ matrix; the weights are rebuilt from what it keeps.

**Encoding** (one entry per text; the bytes are zlib-compressed and base64-encoded, and
every weight $w$ is stored as $\operatorname{round}(255 w)$, so a decoded weight is within
$1/510$ of the model's):

- thumbnails: each head's map max-pooled to at most `thumb` $\times$ `thumb` cells of
  `pool` $\times$ `pool` tokens (a previous-token diagonal stays as bright as it is);
  `(layers, heads, cells, cells)` bytes, left out when `pool` is 1 and every weight is
  kept (the script draws them from the full maps);
- large view, for texts of at most `full_up_to` tokens: every weight of every row
  (row $i$ holds $i + 1$ bytes);
- large view, for longer texts: each row's `top_k` largest weights, sorted by key
  position: the key positions, each as its distance from the previous one of its row
  (16 bits: all low bytes, then all high bytes), then the weights (bytes); what a row
  gives the other keys is shown as one mass, one minus the sum of its kept weights.

Each entry also holds the text's name, its token ids and each token's text, and its
sizes (`layers`, `heads`, `kvHeads`, `t`, `pool`, `cells`, `mode`, `k`, `thumbs`).

Texts are at most [`MAX_TOKENS`][attnlab.tools.model_view.MAX_TOKENS] tokens: the maps of
all heads are held at once while they are encoded.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from attnlab.models.decoder import Decoder
from attnlab.rules._validation import check_int_sequence, check_positive_int

__all__ = [
    "MAX_TOKENS",
    "SCRIPT",
    "ModelView",
    "Tokenizer",
    "attention_weights",
    "encode",
    "model_view",
]

MAX_TOKENS = 512
"""The longest text a view takes: its maps, `layers * heads * t * t` floats, are held at once."""

SCRIPT = "model-view.js"
"""The site's script that draws a view, in `docs/assets/javascripts/`."""

_FORMAT = 1  # bump when the encoding changes: cached entries then no longer match


class Tokenizer(Protocol):
    """What the view needs of a tokenizer (a Hugging Face one has both)."""

    def encode(self, text: str) -> list[int]: ...  # pragma: no cover

    def decode(self, ids: int | list[int]) -> str: ...  # pragma: no cover


@dataclass(frozen=True)
class ModelView:
    """A model view's data, one encoded entry per text (see the module docstring).

    `html()` is the markup for a page that loads `model-view.js` (the site's pages);
    `standalone()` a whole HTML document with the script inline, which `save` writes and
    a notebook shows (`_repr_html_`, in an `iframe`).
    """

    texts: tuple[dict[str, Any], ...]

    @property
    def nbytes(self) -> int:
        """Bytes of the encoded data, as the page carries it (base64 and the JSON around it)."""
        return len(self._json())

    def _json(self) -> str:
        # No "<" inside the <script> that carries the JSON: "</script" would end it, and
        # "<!--<script" would make the parser skip its end.
        return json.dumps(list(self.texts), separators=(",", ":")).replace("<", "\\u003c")

    def html(self) -> str:
        """The view's markup: a `<div data-attn-model-view>` with its data inside.

        Without the script, the div says what it would show; with it, the view.
        """
        names = ", ".join(html.escape(str(entry["name"])) for entry in self.texts)
        return (
            '<div class="attn-mv" data-attn-model-view>'
            f'<p class="attn-mv-fallback">A model view of every attention head on: {names}. '
            "attnlab's script model-view.js draws it: a page of the site loads it, a "
            "notebook shows the view when its cell runs, and ModelView.save writes it to "
            "a file with the script inside.</p>"
            f'<script type="application/json" class="attn-mv-data">{self._json()}</script>'
            "</div>"
        )

    def standalone(self, title: str = "attnlab model view") -> str:
        """A self-contained HTML document of the view (its script inline, nothing loaded)."""
        script = resources.files("attnlab.tools").joinpath("model_view.js").read_text("utf-8")
        script = script.replace("</", "<\\/")  # no "</script>" inside the script
        return (
            '<!doctype html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{html.escape(title)}</title>"
            "<style>body{font-family:system-ui,sans-serif;margin:1em auto;max-width:60em;"
            "padding:0 1em;color:#222}</style></head><body>"
            f"<h1 style='font-size:1.2em'>{html.escape(title)}</h1>{self.html()}"
            f"<script>{script}</script></body></html>"
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write [`standalone`][attnlab.tools.model_view.ModelView.standalone] to `path`."""
        out = Path(path)
        out.write_text(self.standalone(), encoding="utf-8")
        return out

    def _repr_html_(self) -> str:
        doc = html.escape(self.standalone(), quote=True)
        return f'<iframe srcdoc="{doc}" style="width:100%;height:900px;border:0"></iframe>'


def model_view(
    decoder: Decoder,
    tokenizer: Tokenizer,
    texts: str | Sequence[str] | Mapping[str, str | Sequence[int]],
    *,
    top_k: int = 6,
    full_up_to: int = 32,
    thumb: int = 32,
    cache_key: str | None = None,
) -> ModelView:
    """The model view of `decoder` on `texts`: every layer's and head's attention.

    Args:
        decoder: A [`Decoder`][attnlab.models.decoder.Decoder] with softmax attention in
            every layer (no linear-attention or MLA layers).
        tokenizer: Turns a text into ids (`encode`) and an id into its text (`decode`).
        texts: One text, several, or a mapping from a name to a text or to token ids.
        top_k: Weights kept per row for texts longer than `full_up_to`.
        full_up_to: Texts of at most this many tokens keep every weight.
        thumb: Cells per side of a thumbnail, at most.
        cache_key: Names the weights (e.g. the SHA-256 of the file they came from): the
            encoded data are then kept in
            [`cache_dir`][attnlab.models.pretrained.cache_dir]`/model-view`, under a name
            that also hashes the tokens and their texts, the settings and the source of
            attnlab, so any change of those computes them again. None: computed every
            call.

    Returns:
        A [`ModelView`][attnlab.tools.model_view.ModelView].

    Raises:
        TypeError: If `decoder` is not a `Decoder` or a setting is not an int.
        ValueError: If `texts` is empty, a text is empty or longer than
            [`MAX_TOKENS`][attnlab.tools.model_view.MAX_TOKENS] tokens, an id is outside
            the vocabulary, a setting is not positive, or the decoder has layers without
            attention weights or with different numbers of key/value heads.
    """
    if not isinstance(decoder, Decoder):
        raise TypeError(f"decoder must be an attnlab Decoder, got {type(decoder).__name__}")
    c = decoder.config
    kv_heads = {c.heads(layer)[0] for layer in range(c.num_layers)}
    if len(kv_heads) > 1:
        raise ValueError(
            "the model view groups every layer's query heads alike, but this model's "
            f"layers have {sorted(kv_heads)} key/value heads (global_attention)"
        )
    settings = {
        "top_k": check_positive_int("top_k", top_k),
        "full_up_to": check_positive_int("full_up_to", full_up_to),
        "thumb": check_positive_int("thumb", thumb),
    }
    named = _named(texts)
    if not named:
        raise ValueError("texts is empty: give one text or more")
    tokens = {name: _ids(name, value, tokenizer, c.vocab_size) for name, value in named.items()}
    labels = {name: [tokenizer.decode(i) for i in ids] for name, ids in tokens.items()}
    key = {"tokens": tokens, "labels": labels, **settings}
    cached = None if cache_key is None else _cache_file(cache_key, key)
    if cached is not None and cached.is_file():
        return ModelView(tuple(json.loads(cached.read_text("utf-8"))))
    entries = []
    for (name, ids), maps in zip(
        tokens.items(), _all_maps(decoder, [*tokens.values()]), strict=True
    ):
        entry = encode(maps, name, labels[name], kv_heads=c.num_kv_heads, **settings)
        entries.append({**entry, "ids": ids})
    view = ModelView(tuple(entries))
    if cached is not None:
        _write(cached, view)
    return view


def _named(texts: object) -> dict[str, str | Sequence[int]]:
    """`texts` as a mapping from a name (a text's first 40 characters) to a text or ids."""
    if isinstance(texts, Mapping):
        return {str(name): value for name, value in texts.items()}
    many = [texts] if isinstance(texts, str) else texts
    if not isinstance(many, Sequence) or not all(isinstance(t, str) for t in many):
        raise TypeError(
            "texts must be a str, a sequence of str or a mapping from names to texts or ids, "
            f"got {type(texts).__name__}"
        )
    named: dict[str, str | Sequence[int]] = {}
    for n, text in enumerate(many, start=1):
        name = text[:40] if text[:40] not in named else f"{text[:40]} ({n})"
        named[name] = text
    return named


def _ids(name: str, value: object, tokenizer: Tokenizer, vocab_size: int) -> list[int]:
    """A text's token ids: the tokenizer's, or the ids given (`(t,)` or `(1, t)`)."""
    if isinstance(value, str):
        ids = list(tokenizer.encode(value))
    else:
        if isinstance(value, Tensor) and value.ndim == 2 and value.shape[0] == 1:
            value = value[0]  # a tokenizer's `input_ids` of one text
        checked = check_int_sequence(f"texts[{name!r}]", value, high=vocab_size)
        ids = [int(i) for i in checked]
    if not 0 < len(ids) <= MAX_TOKENS:
        raise ValueError(
            f"texts[{name!r}] has {len(ids)} tokens; a model view takes 1 to {MAX_TOKENS}"
        )
    return ids


@contextmanager
def _on_flash(decoder: Decoder) -> Iterator[None]:
    """Every attention layer on the `"flash"` backend (weights from the log-sum-exp),
    except chunked layers, whose mask flash does not take; restored afterwards."""
    layers: list[Any] = [
        block.self_attn
        for block in decoder.layers
        if getattr(block, "chunk", None) is None and getattr(block, "self_attn", None) is not None
    ]
    before = [layer.backend for layer in layers]
    try:
        for layer in layers:
            layer.backend = "flash"
        yield
    finally:
        for layer, backend in zip(layers, before, strict=True):
            layer.backend = backend


def attention_weights(decoder: Decoder, ids: Tensor) -> Tensor:
    """Every layer's and head's attention weights on `ids`.

    Run on attnlab's FlashAttention, the weights recovered from its log-sum-exp.

    Args:
        decoder: The model.
        ids: Token ids `(t,)`, or `(b, t)` for a batch.

    Returns:
        `(layers, heads, t, t)`, or `(layers, b, heads, t, t)` for a batch.
    """
    ids = ids.to(decoder.embed_tokens.weight.device)
    with _on_flash(decoder):
        maps = torch.stack(decoder.attention_maps(ids))  # (layers, [b,] heads, t, t)
    return maps.float().cpu()


_BATCH_FLOATS = 2**26  # 256 MiB of float32 maps per forward pass, at most


def _all_maps(decoder: Decoder, texts: list[list[int]]) -> Iterator[Tensor]:
    """Each text's maps `(layers, heads, t, t)`, from as few forward passes as fit.

    The model is causal: a text's weights do not depend on tokens after it, so texts
    padded to one length run as one batch and each keeps the top-left `t x t` of its
    maps (a forward pass per batch instead of per text: each new length costs the CPU's
    matrix kernels a first call).
    """
    c = decoder.config
    group: list[list[int]] = []
    for ids in [*texts, []]:  # an empty text flushes the last group
        longest = max([len(ids), *map(len, group)])
        if group and (
            not ids or (len(group) + 1) * longest**2 * c.num_layers * c.num_heads > _BATCH_FLOATS
        ):
            batch = torch.zeros(len(group), max(map(len, group)), dtype=torch.long)
            for n, text in enumerate(group):
                batch[n, : len(text)] = torch.tensor(text)  # the rest: token 0, after it
            maps = attention_weights(decoder, batch)  # (layers, b, heads, T, T)
            for n, text in enumerate(group):
                yield maps[:, n, :, : len(text), : len(text)]
            group = []
        if ids:
            group.append(ids)


def _bytes(x: Tensor) -> bytes:
    return bytes(x.contiguous().numpy().tobytes())


def encode(
    maps: Tensor,
    name: str,
    labels: Sequence[str],
    *,
    kv_heads: int,
    top_k: int = 6,
    full_up_to: int = 32,
    thumb: int = 32,
) -> dict[str, Any]:
    """One text's entry of a view from its maps `(layers, heads, t, t)` (module docstring).

    Raises:
        ValueError: If `maps` is not `(layers, heads, t, t)`, `labels` is not one per
            token, `kv_heads` does not divide `heads`, or a setting is not positive.
    """
    if maps.ndim != 4 or maps.shape[-1] != maps.shape[-2]:
        raise ValueError(f"maps must be (layers, heads, t, t), got {tuple(maps.shape)}")
    layers, heads, t, _ = maps.shape
    if len(labels) != t:
        raise ValueError(f"labels has {len(labels)} entries for {t} tokens")
    if kv_heads <= 0 or heads % kv_heads:
        raise ValueError(f"kv_heads={kv_heads} must divide the {heads} heads")
    for option, value in (("top_k", top_k), ("full_up_to", full_up_to), ("thumb", thumb)):
        check_positive_int(option, value)
    pool = math.ceil(t / thumb)
    cells = math.ceil(t / pool)
    padded = torch.zeros(layers, heads, cells * pool, cells * pool)
    padded[..., :t, :t] = maps
    pooled = padded.reshape(layers, heads, cells, pool, cells, pool).amax(dim=(3, 5))
    full = t <= full_up_to
    # A thumbnail of whole tokens is the full map itself: the script draws it from that.
    parts = [] if full and pool == 1 else [_bytes(_quantize(pooled))]  # (l, h, cells, cells)
    if full:
        rows, cols = torch.tril_indices(t, t)
        parts.append(_bytes(_quantize(maps[..., rows, cols])))  # row i: keys 0..i
        mode, k = "full", t
    else:
        k = min(top_k, t)
        top = maps.topk(k, dim=-1)  # (layers, heads, t, k)
        order = top.indices.sort(dim=-1)
        keys = order.values  # (layers, heads, t, k), ascending
        steps = torch.diff(keys, dim=-1, prepend=torch.zeros_like(keys[..., :1]))
        steps16 = steps.to(torch.int32)  # t <= MAX_TOKENS < 2**16
        parts.append(_bytes((steps16 & 255).to(torch.uint8)))  # low bytes, then high:
        parts.append(_bytes((steps16 >> 8).to(torch.uint8)))  # mostly 0, they pack well
        parts.append(_bytes(_quantize(top.values.gather(-1, order.indices))))
        mode = "top"
    data = zlib.compress(b"".join(parts), 9)
    return {
        "name": name,
        "tokens": list(labels),
        "layers": layers,
        "heads": heads,
        "kvHeads": kv_heads,
        "t": t,
        "pool": pool,
        "cells": cells,
        "mode": mode,
        "k": k,
        "thumbs": not (full and pool == 1),
        "data": base64.b64encode(data).decode("ascii"),
    }


def _quantize(weights: Tensor) -> Tensor:
    return (weights.clamp(0.0, 1.0) * 255.0).round().to(torch.uint8)


def _source_digest() -> str:
    """SHA-256 of attnlab's source files, in a fixed order."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for path in sorted(root.rglob("*.py")) + sorted(root.rglob("*.js")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _cache_file(key: str, what: Mapping[str, Any]) -> Path:
    from attnlab.models.pretrained import cache_dir

    name = json.dumps([_FORMAT, key, what, _source_digest()])
    digest = hashlib.sha256(name.encode()).hexdigest()[:24]
    return cache_dir() / "model-view" / f"{digest}.json"


def _write(path: Path, view: ModelView) -> None:
    """Keep `view` at `path`, atomically; a folder that cannot be written is skipped."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(list(view.texts)), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
