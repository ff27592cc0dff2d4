from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from autosearch import TrainConfig, TrialFailed
from autosearch.data import augment
from autosearch.train import evaluate, train


def _model(tiny_space, digits, seed=0):
    torch.manual_seed(seed)
    widest = tiny_space.make({gene: max(d.values()) for gene, d in tiny_space.domains().items()})
    return tiny_space.build(widest, input_shape=digits.input_shape, num_classes=10)


def test_training_learns_and_reports_each_epoch(tiny_space, digits):
    model = _model(tiny_space, digits)
    before, _ = evaluate(model, digits.val, digits)
    seen = []
    result = train(model, digits, TrainConfig(epochs=4, lr=0.1), seed=0, on_epoch=seen.append)
    assert [e.epoch for e in seen] == [1, 2, 3, 4] and result.history == tuple(seen)
    assert result.val_accuracy > 0.8 > before
    assert result.val_accuracy == evaluate(model, digits.val, digits)[0]


def test_same_seed_same_weights(tiny_space, digits):
    config = TrainConfig(epochs=1, crop_padding=1, flip=True)
    a, b = _model(tiny_space, digits), _model(tiny_space, digits)
    train(a, digits, config, seed=4)
    train(b, digits, config, seed=4)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name


def test_callback_can_stop_training(tiny_space, digits):
    class Stop(Exception):
        pass

    def stop_after_first(epoch):
        raise Stop

    with pytest.raises(Stop):
        train(
            _model(tiny_space, digits),
            digits,
            TrainConfig(epochs=5),
            seed=0,
            on_epoch=stop_after_first,
        )


def test_nan_loss_fails_the_trial_with_a_reason(digits):
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(64, 10)

        def forward(self, x):
            return self.head(x.flatten(1)) * float("nan")

    with pytest.raises(TrialFailed, match="loss became nan( or infinite)? at epoch 1"):
        train(Broken(), digits, TrainConfig(epochs=1), seed=0)


def test_augmentation_crops_and_flips_per_sample():
    x = torch.arange(2 * 1 * 4 * 4, dtype=torch.uint8).view(2, 1, 4, 4)
    g = torch.Generator().manual_seed(0)
    out = augment(x, crop_padding=1, flip=False, generator=g)
    assert out.shape == x.shape and out.dtype == torch.uint8
    # each output is a window of the zero-padded input
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1))
    for i in range(2):
        windows = [padded[i, :, r : r + 4, c : c + 4] for r in range(3) for c in range(3)]
        assert any(torch.equal(out[i], w) for w in windows)
    flipped = augment(x, crop_padding=0, flip=True, generator=torch.Generator().manual_seed(1))
    assert all(
        torch.equal(f, o) or torch.equal(f, o.flip(2)) for f, o in zip(flipped, x, strict=True)
    )


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="optimizer"):
        TrainConfig(optimizer="lion")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epochs"):
        TrainConfig(epochs=0)
