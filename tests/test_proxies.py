"""Zero-cost proxies against values worked out by hand on tiny networks, invariant where
their definitions say so, and leaving the network they score untouched."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from autosearch.errors import ConfigError
from autosearch.evaluation.proxies import (
    PROXIES,
    ProxyConfig,
    complexity,
    expressivity,
    grad_norm,
    jacob_cov,
    meco,
    naswot,
    progressivity,
    proxy_scores,
    snip,
    synflow,
    trainability,
)
from autosearch.registry import spaces


def _chain(seed: int = 0, bn: bool = False) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(4, 3, bias=False)]
    layers += [nn.BatchNorm1d(3)] if bn else []
    layers += [nn.ReLU(), nn.Linear(3, 2, bias=False)]
    return nn.Sequential(*layers)


def test_synflow_of_a_two_layer_chain_is_twice_its_path_sum_and_ignores_batch_norm():
    """Each layer's Σ θ ∂R/∂θ is R (R is linear in each layer's |θ|), so a chain of two
    layers scores 2R, R = 1ᵀ |W2| |W1| 1; batch normalization is taken out."""
    model = _chain()
    w1, w2 = (m.weight.detach().abs().double().numpy() for m in (model[0], model[2]))
    path_sum = np.ones(2) @ w2 @ w1 @ np.ones(4)
    x = torch.randn(8, 4)
    assert synflow(model, x, torch.zeros(8, dtype=torch.long)) == pytest.approx(2 * path_sum)
    assert synflow(_chain(bn=True), x, torch.zeros(8, dtype=torch.long)) == pytest.approx(
        2 * path_sum
    )


def test_naswot_is_the_log_determinant_of_the_hamming_kernel():
    """Codes (1,1), (1,0), (0,0) on two units: K = [[2,1,0],[1,2,1],[0,1,2]], det 4."""
    layer = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(2))
    model = nn.Sequential(layer, nn.ReLU())
    x = torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, -1.0]])
    assert naswot(model, x, torch.zeros(3, dtype=torch.long)) == pytest.approx(math.log(4))


def test_naswot_sees_rectifiers_called_as_functions_too():
    class Functional(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.relu(x)

    x = torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, -1.0]])
    assert naswot(Functional(), x, torch.zeros(3, dtype=torch.long)) == pytest.approx(math.log(4))


def test_jacob_cov_of_a_linear_map_has_one_correlated_direction():
    """Every image's gradient is the same vector W: the correlation matrix is all ones,
    eigenvalues N and N-1 zeros."""
    model = nn.Linear(3, 1, bias=False)
    n, k = 5, 1e-5
    expected = -(math.log(n + k) + 1 / (n + k) + (n - 1) * (math.log(k) + 1 / k))
    score = jacob_cov(model, torch.randn(n, 3), torch.zeros(n, dtype=torch.long))
    assert score == pytest.approx(expected, rel=1e-6)


def test_snip_and_grad_norm_of_a_linear_classifier():
    """logits = W x: ∂L/∂W = (softmax − onehot)ᵀ x / N for the mean cross-entropy."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3, bias=False)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    w = model.weight.detach().double().numpy()
    logits = x.double().numpy() @ w.T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    grad = (p - np.eye(3)[y.numpy()]).T @ x.double().numpy() / 6
    assert snip(model, x, y) == pytest.approx(np.abs(w * grad).sum(), rel=1e-5)
    assert grad_norm(model, x, y) == pytest.approx(np.linalg.norm(grad), rel=1e-5)


def _pointwise(*weights: list[list[float]]) -> nn.Sequential:
    """Blocks of 1x1 convolutions with the given channel-mixing matrices."""
    layers = []
    for w in weights:
        conv = nn.Conv2d(len(w[0]), len(w), 1, bias=False)
        with torch.no_grad():
            conv.weight.copy_(torch.tensor(w)[:, :, None, None])
        layers.append(conv)
    return nn.Sequential(*layers)


# Two channels over four positions, centred, uncorrelated, of equal variance: their
# covariance is the identity.
_ISOTROPIC = torch.tensor([[[[1.0, -1.0], [1.0, -1.0]], [[1.0, 1.0], [-1.0, -1.0]]]])


def test_expressivity_and_progressivity_are_the_entropies_of_the_blocks_spectra():
    """f0 (the input) and f1 (an identity block) span both directions evenly: entropy
    log 2; f2 keeps one channel: entropy 0. Expressivity sums the blocks' (f1, f2):
    log 2; progressivity is the least step, f1 → f2: −log 2."""
    model = _pointwise([[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 0.0]])
    y = torch.zeros(1, dtype=torch.long)
    assert expressivity(model, _ISOTROPIC, y) == pytest.approx(math.log(2))
    assert progressivity(model, _ISOTROPIC, y) == pytest.approx(-math.log(2))
    squeezed = _pointwise([[3.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]])
    p = np.array([9.0, 1.0]) / 10  # the first channel's variance 9, the second's 1
    entropy = float(-(p * np.log(p)).sum())
    assert expressivity(squeezed, _ISOTROPIC, y) == pytest.approx(2 * entropy)


@pytest.mark.parametrize("gain", [1.0, 2.0, 0.5])
def test_trainability_of_blocks_that_scale_by_a_gain_is_minus_gain_plus_its_inverse_minus_2(gain):
    """Each block multiplies by ``gain``: its Jacobian's spectral norm is the gain,
    whatever the random vector, and 1 (neither exploding nor vanishing) scores 0."""
    model = _pointwise(*[[[gain, 0.0], [0.0, gain]]] * 3)
    x, y = torch.randn(4, 2, 3, 3), torch.zeros(4, dtype=torch.long)
    assert trainability(model, x, y) == pytest.approx(-(gain + 1 / gain - 2), abs=1e-6)


def test_complexity_counts_the_multiply_accumulates_of_an_image():
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1, groups=4),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3),
    )  # fmt: skip
    x, y = torch.randn(5, 2, 5, 5), torch.zeros(5, dtype=torch.long)
    assert complexity(model, x, y) == 4 * 25 * 2 * 9 + 4 * 25 * 1 * 9 + 3 * 4


def test_meco_is_the_least_eigenvalue_of_the_channels_correlation():
    """Uncorrelated channels: correlation the identity, least eigenvalue 1 (one
    convolution); two copies of one channel: all ones, least eigenvalue 0."""
    y = torch.zeros(1, dtype=torch.long)
    assert meco(_pointwise([[1.0, 0.0], [0.0, 1.0]]), _ISOTROPIC, y) == pytest.approx(1.0)
    assert meco(_pointwise([[1.0, 0.0], [1.0, 0.0]]), _ISOTROPIC, y) == pytest.approx(0.0, abs=1e-9)
    # three channels over two positions: a singular correlation, 0 without computing it
    wide = _pointwise([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert meco(wide, torch.tensor([[[[1.0, -1.0]], [[2.0, 0.0]]]]), y) == 0.0


def test_expressivity_of_more_channels_than_samples_is_the_covariances_entropy():
    """Fewer samples (images × positions) than channels: the smaller Gram matrix has
    the covariance's nonzero eigenvalues, so the entropy is the covariance's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 12, 1, bias=False), nn.Conv2d(12, 12, 1, bias=False))
    x, y = torch.randn(2, 2, 1, 3), torch.zeros(2, dtype=torch.long)
    features = [x, model[0](x), model(x)]
    entropies = []
    for f in features:
        m = f.detach().permute(0, 2, 3, 1).reshape(-1, f.shape[1]).double().numpy()
        m = m - m.mean(axis=0)
        eigenvalues = np.clip(np.linalg.eigvalsh(m.T @ m / len(m)), 0, None)
        p = eigenvalues[eigenvalues > 1e-12] / eigenvalues.sum()
        entropies.append(float(-(p * np.log(p)).sum()))
    assert expressivity(model, x, y) == pytest.approx(entropies[1] + entropies[2], rel=1e-6)


def _convnet(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, bias=False),
        nn.BatchNorm2d(4, eps=1e-12),  # exactly scale-invariant (eps would weigh in)
        nn.ReLU(inplace=True),
        nn.Conv2d(4, 4, 3, padding=1, bias=False),
        nn.BatchNorm2d(4, eps=1e-12),  # exactly scale-invariant (eps would weigh in)
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 3),
    )


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 10_000), scale=st.floats(0.1, 10.0))
def test_what_batch_norm_undoes_and_the_order_of_the_batch_change_no_proxy_that_sees_data(
    seed, scale
):
    """Convolutions followed by batch normalization compute the same function whatever
    positive factor scales their weights: naswot and jacob_cov, which see only the
    function, do not move; and no proxy depends on the order of the images."""
    model = _convnet(seed)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 1, 6, 6, generator=generator)
    y = torch.randint(0, 3, (8,), generator=generator)
    scaled = _convnet(seed)
    with torch.no_grad():
        for m in scaled.modules():
            if isinstance(m, nn.Conv2d):
                m.weight.mul_(scale)
    for proxy in (naswot, jacob_cov, expressivity, progressivity, meco, complexity):
        assert proxy(scaled, x, y) == pytest.approx(proxy(model, x, y), rel=1e-4, abs=1e-6)
    order = torch.randperm(8, generator=generator)
    for proxy in (naswot, jacob_cov, snip, grad_norm, expressivity, progressivity, trainability):
        assert proxy(model, x[order], y[order]) == pytest.approx(
            proxy(model, x, y), rel=1e-5, abs=1e-8
        )


def test_scores_are_deterministic_and_leave_the_network_untouched():
    model = _convnet(3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.randn(8, 1, 6, 6), torch.randint(0, 3, (8,))
    first, second = proxy_scores(model, x, y), proxy_scores(_convnet(3), x, y)
    assert {k: v for k, v in first.items() if not k.endswith("_seconds")} == {
        k: v for k, v in second.items() if not k.endswith("_seconds")
    }
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(math.isfinite(first[n]) for n in PROXIES)
    assert all(p.grad is None for p in model.parameters())
    # one pass serves them all: each proxy alone scores what it scores beside the others
    for name in PROXIES:
        assert PROXIES[name](model, x, y) == pytest.approx(first[name], rel=1e-9)


def test_a_rectifier_in_place_changes_no_feature_kept_before_it():
    """A block that rectifies its input in place (DenseNet's last layers) would rewrite
    the feature the block before it handed over: the proxies score the same network
    written either way."""

    def net(inplace: bool) -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=inplace),
            nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=inplace),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3),
        )  # fmt: skip

    x, y = torch.randn(8, 1, 6, 6), torch.randint(0, 3, (8,))
    plain, in_place = proxy_scores(net(False), x, y), proxy_scores(net(True), x, y)
    for name in PROXIES:
        assert in_place[name] == pytest.approx(plain[name], rel=1e-9), name


@pytest.mark.parametrize("kind", sorted(spaces.names()))
def test_every_space_gets_the_default_estimate_from_its_primary_blocks(kind):
    """Each registered space's network has primary blocks (the features AZ-NAS's proxies
    read) and a finite score for each of the default estimate's proxies."""
    from autosearch.evaluation.proxies import _blocks

    if reason := spaces.get(kind).unavailable():
        pytest.skip(reason)
    space = spaces.get(kind).example()
    torch.manual_seed(0)
    net = space.build(space.default(), input_shape=(3, 32, 32), num_classes=10)
    assert len(_blocks(net)) >= 2
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    found = proxy_scores(net, x, y, ProxyConfig().names)
    assert all(math.isfinite(found[n]) for n in ProxyConfig().names), found


def test_unknown_proxies_and_bad_batches_are_refused():
    from autosearch.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match="unknown proxy 'synflw'. Did you mean 'synflow'"):
        ProxyConfig(names=("synflw",))
    assert ProxyConfig(names="synflow").names == ("synflow",)  # one name, not its letters
    with pytest.raises(ConfigError, match="names=\\(\\): name at least one"):
        ProxyConfig(names=())
    with pytest.raises(ConfigError, match="has no trainable parameters"):
        proxy_scores(nn.Sequential(nn.Flatten()), torch.zeros(4, 1, 8, 8), torch.zeros(4).long())
    with pytest.raises(ConfigError, match="batch=1: expected an integer >= 2"):
        ProxyConfig(batch=1)


# In a study ------------------------------------------------------------------------------
PROXY_NAMES = ProxyConfig().names  # the default estimate's proxies


def test_a_study_stores_every_candidates_proxies_and_trains_as_without_them(make_study, tmp_path):
    """Each trial's base point holds the proxies of the network at the initialization
    it trained from, on one batch drawn with the study's seed; the same again in a
    second study of the same seed (the values stored are a function of the seed and the
    architecture), and its training is the same as without them (torch's random state
    is left as it was)."""
    import autosearch
    from autosearch.report import write_report

    config = autosearch.ProxyConfig(batch=16)
    first = make_study("with", proxies=config)
    first.optimize(3)  # three to rank
    again = make_study("again", proxies=config)
    again.optimize(2)
    plain = make_study("plain")
    plain.optimize(2)
    stored = first.definition.proxies
    assert stored is not None and stored.seed == first.definition.seed  # the study's seed, stored
    for a, b, c in zip(first.records()[:2], again.records(), plain.records(), strict=True):
        assert a.arch.arch_id == b.arch.arch_id == c.arch.arch_id
        assert {*PROXY_NAMES, "proxy_seconds"} <= set(a.metrics)
        assert all(math.isfinite(a.metrics[n]) for n in PROXY_NAMES)
        assert {n: a.metrics[n] for n in PROXY_NAMES} == {n: b.metrics[n] for n in PROXY_NAMES}
        assert a.metrics["accuracy"] == c.metrics["accuracy"]  # trained the same
        assert not set(PROXY_NAMES) & set(c.metrics)
    reopened = autosearch.load_study("with", storage=first.storage_url)
    assert reopened.definition.proxies == stored
    page = write_report(first, tmp_path / "report.html").read_text()
    assert "Zero-cost proxies" in page and "synflow" in page
    assert "Zero-cost proxies" not in write_report(plain, tmp_path / "plain.html").read_text()


def test_a_study_with_other_proxies_is_not_continued_and_a_table_study_takes_none(
    make_study, tmp_path
):
    import autosearch
    from autosearch.errors import ConfigError, StudyError

    make_study("p", proxies=autosearch.ProxyConfig(names=("synflow",), batch=8))
    with pytest.raises(StudyError, match="proxies: stored"):
        make_study("p", proxies=autosearch.ProxyConfig(batch=8), load_if_exists=True)
    with pytest.raises(ConfigError, match="takes a ProxyConfig"):
        make_study("q", proxies={"names": ["synflow"]})
    table = autosearch.Table(path=str(tmp_path / "none.csv"))
    with pytest.raises(ConfigError, match="table study .* takes no proxies="):
        make_study("r", table=table, proxies=autosearch.ProxyConfig())
