"""SelfAttention and the wrapper: the article's numbers and an independent reference."""

import pytest
import torch
import torch.nn.functional as F

from attnlab import MultiHeadAttentionWrapper, SelfAttention
from attnlab.article.toy import embed_sentence

# Printed in the article (4 decimals) after torch.manual_seed(123).
ARTICLE_SELF_ATTENTION = torch.tensor(
    [
        [-0.1564, 0.1028, -0.0763, -0.0764],
        [0.5313, 1.3607, 0.7891, 1.3110],
        [-0.3542, -0.1234, -0.2627, -0.3706],
        [0.0071, 0.3345, 0.0969, 0.1998],
        [0.1008, 0.4780, 0.2021, 0.3674],
        [-0.5296, -0.2799, -0.4107, -0.6006],
    ]
)
ARTICLE_WRAPPER = torch.tensor(
    [
        [-0.0185, 0.0170, 0.1999, -0.0860],
        [0.4003, 1.7137, 1.3981, 1.0497],
        [-0.1103, -0.1609, 0.0079, -0.2416],
        [0.0668, 0.3534, 0.2322, 0.1008],
        [0.1180, 0.6949, 0.3157, 0.2807],
        [-0.1827, -0.2060, -0.2393, -0.3167],
    ]
)
# Half a unit in the 4th decimal, plus float32 noise: -0.26265 is printed -0.2627 there.
ARTICLE_ATOL = 5.1e-5


def test_self_attention_reproduces_article() -> None:
    torch.manual_seed(123)
    sa = SelfAttention(d_in=3, d_out_kq=2, d_out_v=4)
    torch.testing.assert_close(
        sa(embed_sentence()).detach(), ARTICLE_SELF_ATTENTION, atol=ARTICLE_ATOL, rtol=0.0
    )


def test_wrapper_reproduces_article() -> None:
    torch.manual_seed(123)
    mha = MultiHeadAttentionWrapper(d_in=3, d_out_kq=2, d_out_v=1, num_heads=4)
    torch.testing.assert_close(
        mha(embed_sentence()).detach(), ARTICLE_WRAPPER, atol=ARTICLE_ATOL, rtol=0.0
    )


def test_self_attention_equals_torch_sdpa() -> None:
    sa = SelfAttention(d_in=5, d_out_kq=3, d_out_v=7)
    x = torch.randn(2, 4, 5)
    expected = F.scaled_dot_product_attention(x @ sa.W_query, x @ sa.W_key, x @ sa.W_value)
    torch.testing.assert_close(sa(x), expected)


def test_self_attention_weights_rows_sum_to_one() -> None:
    sa = SelfAttention(d_in=5, d_out_kq=3, d_out_v=7)
    w = sa.attention_weights(torch.randn(4, 5))
    assert w.shape == (4, 4)
    torch.testing.assert_close(w.sum(-1), torch.ones(4))


@pytest.mark.parametrize("module_cls", [SelfAttention, MultiHeadAttentionWrapper])
def test_batched_rows_equal_unbatched(module_cls: type) -> None:
    args = (5, 3, 2) if module_cls is SelfAttention else (5, 3, 2, 3)
    module = module_cls(*args)
    x = torch.randn(3, 6, 5)
    batched = module(x)
    for i in range(3):
        torch.testing.assert_close(batched[i], module(x[i]))


def test_wrapper_heads_are_independent_self_attentions() -> None:
    torch.manual_seed(123)
    wrapper = MultiHeadAttentionWrapper(d_in=3, d_out_kq=2, d_out_v=2, num_heads=3)
    x = torch.randn(6, 3)
    out = wrapper(x)
    assert out.shape == (6, 6)
    for h, head in enumerate(wrapper.heads):
        torch.testing.assert_close(out[:, 2 * h : 2 * h + 2], head(x))


def test_parameters_are_created_query_key_value() -> None:
    torch.manual_seed(123)
    sa = SelfAttention(d_in=3, d_out_kq=2, d_out_v=4)
    torch.manual_seed(123)
    torch.testing.assert_close(sa.W_query.detach(), torch.rand(3, 2))
    torch.testing.assert_close(sa.W_key.detach(), torch.rand(3, 2))
    torch.testing.assert_close(sa.W_value.detach(), torch.rand(3, 4))


def test_gradients_flow_to_all_parameters() -> None:
    sa = SelfAttention(d_in=3, d_out_kq=2, d_out_v=4)
    sa(torch.randn(5, 3)).sum().backward()
    for p in (sa.W_query, sa.W_key, sa.W_value):
        assert p.grad is not None
        assert p.grad.abs().sum() > 0


def test_parameter_names_and_shapes_are_stable() -> None:
    """Checkpoints and the chapters address the matrices by these names, in this order."""
    sa = SelfAttention(d_in=5, d_out_kq=3, d_out_v=7)
    shapes = {name: tuple(p.shape) for name, p in sa.named_parameters()}
    assert list(shapes.items()) == [("W_query", (5, 3)), ("W_key", (5, 3)), ("W_value", (5, 7))]
    wrapper = MultiHeadAttentionWrapper(d_in=5, d_out_kq=3, d_out_v=2, num_heads=2)
    assert list(wrapper.state_dict()) == [
        f"heads.{h}.{name}" for h in range(2) for name in ("W_query", "W_key", "W_value")
    ]
