"""TinyTransformer exports to ONNX with validation on, and the graph computes the same logits.

The checks that read tensor values (the token ids' range) are host syncs that
`torch.export` cannot trace; they are skipped while exporting, so the export works
without switching validation off, and they still run in eager mode.
"""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab.model import ModelConfig, TinyTransformer

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
ort = pytest.importorskip("onnxruntime")


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch's exporter, not attnlab
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_tiny_transformer_onnx_export_with_validation_on_equals_eager() -> None:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=13, max_len=10, d_model=12, num_heads=3, mlp=True)
    model = TinyTransformer(config).eval()
    tokens = torch.randint(0, 13, (2, 10))
    assert attnlab.is_validation_enabled()
    program = torch.onnx.export(model, (tokens,), dynamo=True, verbose=False)
    assert program is not None
    onnx.checker.check_model(program.model_proto)
    session = ort.InferenceSession(
        program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (name,) = [i.name for i in session.get_inputs()]
    (logits,) = session.run(None, {name: tokens.numpy()})
    with torch.no_grad():
        expected = model(tokens)
    torch.testing.assert_close(torch.from_numpy(logits), expected, rtol=1e-4, atol=1e-5)
    # The value check still runs outside the export.
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, 13\)"):
        model(torch.full((1, 4), 13))
