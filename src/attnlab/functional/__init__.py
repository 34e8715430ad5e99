"""The kernels: pure functions of attention, like `torch.nn.functional`.

Every function here takes tensors and returns tensors; none owns weights. The modules:

- [`sdpa`][attnlab.functional.sdpa]: scaled dot-product attention from scratch, step by
  step and as one call with PyTorch's semantics;
- [`flash`][attnlab.functional.flash]: FlashAttention's tiled forward and backward and the
  online-softmax merge of partial results;
- [`lse_weights`][attnlab.functional.lse_weights]: the attention weights of any rows,
  recovered from a fused kernel's log-sum-exp in one pass over the keys;
- [`triton_flash`][attnlab.functional.triton_flash] and
  [`triton_kernels`][attnlab.functional.triton_kernels]: FlashAttention-2 as Triton
  kernels (compiled on a GPU, interpreted on the CPU; needs Triton);
- [`backends`][attnlab.functional.backends]: the registry the layers pick a kernel from by
  name (`"torch"`, `"scratch"`, `"flash"`, `"triton"`);
- [`flex`][attnlab.functional.flex]: every mask as a FlexAttention `mask_mod`/`score_mod`;
- [`paged`][attnlab.functional.paged]: attention over a paged KV cache's pools and tables;
- [`paged_fast`][attnlab.functional.paged_fast]: the same, fast on the CPU, which serving runs;
- [`linear`][attnlab.functional.linear]: linear attention and the (gated) delta rule;
- [`sparse`][attnlab.functional.sparse]: top-k key selection for sparse attention.

The names below are the ones a chapter calls as `F.<name>` after
`from attnlab import functional as F`.
"""

from attnlab.functional.flash import flash_attention
from attnlab.functional.lse_weights import weights_from_lse
from attnlab.functional.sdpa import (
    attention_scores,
    attention_weights,
    context_vectors,
    scaled_dot_product_attention,
    scaled_softmax,
)

__all__ = [
    "attention_scores",
    "attention_weights",
    "context_vectors",
    "flash_attention",
    "scaled_dot_product_attention",
    "scaled_softmax",
    "weights_from_lse",
]
