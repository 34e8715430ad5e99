"""MkDocs hook: the weights of the live model, as a script the site serves.

"Watching heads learn" runs the committed induction model in the reader's browser
(`assets/javascripts/live-model.js`). Its weights are written at every build from
`docs/assets/model/induction.pt` by `attnlab.plotting.live_model_asset` into the
generated file `assets/model/induction-weights.js`, so the repository holds them once,
as the `.pt`, and the script can never lag behind the weights. A generated file works
under `mkdocs serve` too (the `.pt` sits in docs/, which it watches).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ASSET = "assets/model/induction-weights.js"  # live-model.js finds it beside its folder


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    from attnlab.plotting import live_model_asset
    from attnlab.train import load_run

    run = Path(config["docs_dir"]) / "assets" / "model"
    model, _ = load_run(run)
    files.append(File.generated(config, ASSET, content=live_model_asset(model)))
    return files
