import torch
import torch.nn.functional as F

from attnlab import CausalSelfAttention, SelfAttention
from attnlab.article.toy import embed_sentence

ARTICLE_CAUSAL_WEIGHTS = torch.tensor(
    [
        [1.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000],
        [0.0532, 0.9468, 0.0000, 0.0000, 0.0000, 0.0000],
        [0.3862, 0.1214, 0.4924, 0.0000, 0.0000, 0.0000],
        [0.2232, 0.3242, 0.2078, 0.2449, 0.0000, 0.0000],
        [0.1536, 0.3145, 0.1325, 0.1849, 0.2145, 0.0000],
        [0.1973, 0.0247, 0.3102, 0.1132, 0.0751, 0.2794],
    ]
)


def test_causal_weights_reproduce_article() -> None:
    torch.manual_seed(123)
    csa = CausalSelfAttention(d_in=3, d_out_kq=2, d_out_v=4)
    weights = csa.attention_weights(embed_sentence()).detach()
    torch.testing.assert_close(weights, ARTICLE_CAUSAL_WEIGHTS, atol=5.1e-5, rtol=0)


def test_causal_equals_renormalized_masked_weights() -> None:
    torch.manual_seed(3)
    csa = CausalSelfAttention(d_in=4, d_out_kq=3, d_out_v=5)
    full = SelfAttention(4, 3, 5)
    full.load_state_dict(csa.state_dict())
    x = torch.randn(7, 4)
    masked = full.attention_weights(x).tril()
    renormalized = masked / masked.sum(-1, keepdim=True)
    torch.testing.assert_close(csa.attention_weights(x), renormalized)


def test_causal_equals_torch_sdpa_is_causal() -> None:
    csa = CausalSelfAttention(d_in=4, d_out_kq=3, d_out_v=5)
    x = torch.randn(2, 6, 4)
    expected = F.scaled_dot_product_attention(
        x @ csa.W_query, x @ csa.W_key, x @ csa.W_value, is_causal=True
    )
    torch.testing.assert_close(csa(x), expected)


def test_future_tokens_do_not_change_earlier_outputs() -> None:
    csa = CausalSelfAttention(d_in=4, d_out_kq=3, d_out_v=5)
    x = torch.randn(6, 4)
    y = x.clone()
    y[4:] = torch.randn(2, 4)
    torch.testing.assert_close(csa(x)[:4], csa(y)[:4])
    assert not torch.allclose(csa(x)[4:], csa(y)[4:])


def test_batched_rows_equal_unbatched() -> None:
    csa = CausalSelfAttention(d_in=4, d_out_kq=3, d_out_v=5)
    x = torch.randn(3, 6, 4)
    out = csa(x)
    for i in range(3):
        torch.testing.assert_close(out[i], csa(x[i]))
