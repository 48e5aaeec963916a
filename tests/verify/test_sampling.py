import pytest
import torch

from specdec.verify.sampling import SamplingParams, logits_to_probs, sample


def test_temperature_zero_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 2.0, 2.0, -1.0], [3.0, 0.0, 0.0, 0.0]])
    probs = logits_to_probs(logits, temperature=0)
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]))  # ties: lowest id


def test_temperature_scales_logits():
    logits = torch.randn(3, 10)
    assert torch.allclose(logits_to_probs(logits, temperature=0.5), (logits / 0.5).softmax(-1), atol=1e-6)


def test_top_k_keeps_k_largest():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0, 0.0]])
    probs = logits_to_probs(logits, temperature=1.0, top_k=2)
    assert (probs > 0).tolist() == [[False, True, True, False, False]]
    assert torch.allclose(probs.sum(-1), torch.ones(1))


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs_in = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    probs = logits_to_probs(probs_in.log(), temperature=1.0, top_p=0.8)
    assert (probs > 0).tolist() == [[True, True, False, False]]  # 0.5 + 0.3 reaches 0.8
    probs = logits_to_probs(probs_in.log(), temperature=1.0, top_p=0.81)
    assert (probs > 0).tolist() == [[True, True, True, False]]
    probs = logits_to_probs(probs_in.log(), temperature=1.0, top_p=0.1)
    assert (probs > 0).tolist() == [[True, False, False, False]]  # the top token always stays


def test_top_p_keeps_every_token_tied_with_the_last_one_kept():
    """Which of equal logits a sort puts first is not the tokens' business: where top-p's mass is reached inside a run
    of ties (bf16 logits tie often), all of them stay, on every device and in any order of the vocabulary."""
    logits = torch.tensor([[2.0, 1.0, 1.0, 1.0, 0.0]])
    for order in (torch.arange(5), torch.tensor([3, 0, 4, 1, 2])):
        probs = logits_to_probs(logits[:, order], temperature=1.0, top_p=0.6)  # 2.0 holds 0.45, each 1.0 0.16
        assert (probs[0] > 0).tolist() == (logits[0, order] >= 1).tolist()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-0.5), "temperature must be a finite number >= 0"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature must be a finite number >= 0 .* got inf"),
        (dict(top_p=0.0), r"top_p must lie in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must lie in \(0, 1\]"),
        (dict(top_k=-1), "top_k must be a non-negative integer"),
    ],
)
def test_bad_sampling_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        logits_to_probs(torch.zeros(1, 4), **kwargs)
    with pytest.raises(ValueError, match=match):
        SamplingParams(**{"temperature": 1.0, **kwargs})


def test_sample_follows_probs():
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3]).expand(40000, -1)
    counts = torch.bincount(sample(probs, g), minlength=4).float() / 40000
    assert counts[1] == 0
    assert torch.allclose(counts, probs[0], atol=0.01)


def test_sample_is_reproducible_with_a_generator():
    probs = torch.rand(5, 50).softmax(-1)
    a = sample(probs, torch.Generator().manual_seed(3))
    b = sample(probs, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
