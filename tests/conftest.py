"""Fixtures shared by the unit tests."""

from __future__ import annotations

from typing import Any

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def smollm2() -> tuple[Any, Any, Any]:
    """(transformers' SmolLM2-135M, attnlab's Decoder copy of it, the tokenizer).

    Loaded once per test session (the loaders cache per process, so the chapters' blocks
    that run in this session reuse them too).
    """
    from attnlab import pretrained

    hf, tokenizer = pretrained.load_smollm2()
    decoder, same_tokenizer = pretrained.smollm2_decoder()
    assert same_tokenizer is tokenizer  # one load per process
    return hf, decoder, tokenizer
