"""MkDocs hook: the weights of the live model, as a script the site serves.

"Watching heads learn" runs the committed induction model in the reader's browser
(`assets/javascripts/live-model.js`). Its weights are written at every build from
`docs/assets/model/induction.pt` by `live_model_asset` into the
generated file `assets/model/induction-weights.js`, so the repository holds them once,
as the `.pt`, and the script can never lag behind the weights. A generated file works
under `mkdocs serve` too (the `.pt` sits in docs/, which it watches).
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import torch

from attnlab.models.tiny import TinyTransformer
from attnlab.tools.plotting import LIVE_GLOBAL, check_live_model

ASSET = "assets/model/induction-weights.js"  # live-model.js finds it beside its folder


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    from attnlab.tools.train import load_run

    run = Path(config["docs_dir"]) / "assets" / "model"
    model, _ = load_run(run)
    files.append(File.generated(config, ASSET, content=live_model_asset(model)))
    return files


def live_model_asset(model: TinyTransformer) -> str:
    """The weights and sizes of a model, as a script for the site's live-model widget.

    The script sets `window.attnlabLiveModel` to `{"config", "tensors", "data"}`: the
    model's [`ModelConfig`][attnlab.models.tiny.ModelConfig] as a dict, the name and shape of
    every tensor of its state dict in order, and all their values as one base64 string
    of little-endian float32, the tensors one after another (row-major). The documentation
    build writes it from the committed weights (the hook below).

    Args:
        model: An attention-only [`TinyTransformer`][attnlab.models.tiny.TinyTransformer].

    Returns:
        JavaScript source, one statement.

    Raises:
        TypeError: If `model` is not a `TinyTransformer`.
        ValueError: If it has an MLP, which the browser forward does not run.

    Examples:
        >>> import torch
        >>> from attnlab.models.tiny import ModelConfig, TinyTransformer
        >>> model = TinyTransformer(ModelConfig(vocab_size=5, max_len=4, d_model=8))
        >>> live_model_asset(model).startswith("window.attnlabLiveModel = {")
        True
    """
    model = check_live_model(model)
    tensors, chunks = [], []
    for name, tensor in model.state_dict().items():
        values = tensor.detach().to(device="cpu", dtype=torch.float32).contiguous()
        tensors.append([name, list(values.shape)])
        data = values.numpy().tobytes()
        chunks.append(data if sys.byteorder == "little" else values.numpy().byteswap().tobytes())
    payload = {
        "config": model.config.to_dict(),
        "tensors": tensors,
        "data": base64.b64encode(b"".join(chunks)).decode("ascii"),
    }
    return f"window.{LIVE_GLOBAL} = {json.dumps(payload, separators=(',', ':'))};\n"
