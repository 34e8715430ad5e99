"""MkDocs hook: the model view's script, served from the package's one copy.

`attnlab.tools.model_view` draws its views with `model_view.js`, which ships inside the
package so that `ModelView.standalone()` (a file, a notebook) can inline it. The site
serves the same file as `assets/javascripts/model-view.js` (listed in `mkdocs.yml`'s
`extra_javascript`), written at every build from the package, so there is one copy.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

ASSET = "assets/javascripts/model-view.js"


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    script = resources.files("attnlab.tools").joinpath("model_view.js").read_text("utf-8")
    files.append(File.generated(config, ASSET, content=script))
    return files
