"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
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
    from attnlab.models import pretrained

    hf, tokenizer = pretrained.load_smollm2()
    decoder, same_tokenizer = pretrained.smollm2_decoder()
    assert same_tokenizer is tokenizer  # one load per process
    return hf, decoder, tokenizer


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread for a module of tiny models: on a busy two-core machine, two
    threads make every small op wait for both."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
