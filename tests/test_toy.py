import torch

from attnlab.article import toy


def test_build_vocab_matches_article() -> None:
    assert toy.build_vocab() == {
        "Life": 0,
        "dessert": 1,
        "eat": 2,
        "first": 3,
        "is": 4,
        "short": 5,
    }


def test_encode_matches_article() -> None:
    assert toy.encode().tolist() == [0, 4, 5, 2, 1, 3]


def test_encode_unknown_word_names_it() -> None:
    import pytest

    with pytest.raises(KeyError, match="zebra"):
        toy.encode("Life zebra", toy.build_vocab())


def test_embed_sentence_matches_article() -> None:
    expected = torch.tensor(
        [
            [0.3374, -0.1778, -0.3035],
            [0.1794, 1.8951, 0.4954],
            [0.2692, -0.0770, -1.0205],
            [-0.2196, -0.3792, 0.7671],
            [-0.5880, 0.3486, 0.6603],
            [-1.1925, 0.6984, -1.4097],
        ]
    )
    torch.testing.assert_close(toy.embed_sentence(), expected, atol=5e-5, rtol=0)


def test_embed_sentence_leaves_global_rng_alone() -> None:
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    toy.embed_sentence()
    torch.testing.assert_close(torch.rand(3), expected, atol=0, rtol=0)
