import pytest
import torch
import torch.nn.functional as F

from attnlab import CrossAttention, SelfAttention
from attnlab.article.toy import embed_sentence


def test_cross_attention_equals_torch_sdpa() -> None:
    ca = CrossAttention(d_in=4, d_out_kq=3, d_out_v=5)
    x, context = torch.randn(2, 6, 4), torch.randn(2, 8, 4)
    expected = F.scaled_dot_product_attention(
        x @ ca.W_query, context @ ca.W_key, context @ ca.W_value
    )
    out = ca(x, context)
    assert out.shape == (2, 6, 5)
    torch.testing.assert_close(out, expected)


def test_cross_attention_over_itself_is_self_attention() -> None:
    torch.manual_seed(123)
    ca = CrossAttention(3, 2, 4)
    torch.manual_seed(123)
    sa = SelfAttention(3, 2, 4)
    x = embed_sentence()
    torch.testing.assert_close(ca(x, x), sa(x))


def test_cross_attention_weights_shape_and_rows() -> None:
    torch.manual_seed(123)
    ca = CrossAttention(3, 2, 4)
    context = torch.rand(8, 3)
    w = ca.attention_weights(embed_sentence(), context)
    assert w.shape == (6, 8)
    torch.testing.assert_close(w.sum(-1), torch.ones(6))


def test_cross_attention_batched_rows_equal_unbatched() -> None:
    ca = CrossAttention(4, 3, 5)
    x, context = torch.randn(3, 6, 4), torch.randn(3, 8, 4)
    out = ca(x, context)
    for i in range(3):
        torch.testing.assert_close(out[i], ca(x[i], context[i]))


def test_cross_attention_rejects_mismatched_batches() -> None:
    ca = CrossAttention(4, 3, 5)
    with pytest.raises(ValueError, match=r"same batch size.*\(2, 6, 4\).*\(3, 8, 4\)"):
        ca(torch.randn(2, 6, 4), torch.randn(3, 8, 4))
