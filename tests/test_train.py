from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn

from autosearch import TrainConfig, TrialFailed
from autosearch.data import augment
from autosearch.training.train import evaluate, train


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


def _rates(config, steps_per_epoch):
    from autosearch.training._optim import make_optimizer, make_schedule

    optimizer = make_optimizer([nn.Parameter(torch.zeros(1))], config, graphed=False)
    schedule = make_schedule(optimizer, config, steps_per_epoch, config.epochs)
    rates = []
    for _ in range(config.epochs * steps_per_epoch):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return rates


def test_warmup_rises_linearly_to_the_peak_then_anneals_to_zero():
    rates = _rates(TrainConfig(epochs=4, lr=0.2, warmup_epochs=1), steps_per_epoch=10)
    assert rates[:10] == pytest.approx([0.02 * (i + 1) for i in range(10)])
    assert rates[10] == pytest.approx(0.2) and max(rates) == pytest.approx(0.2)
    after = rates[10:]
    assert all(a > b for a, b in itertools.pairwise(after)) and after[-1] < 0.001
    # Half an epoch is five steps; none leaves torch's cosine schedule as it was.
    assert _rates(TrainConfig(epochs=2, lr=0.2, warmup_epochs=0.5), 10)[:5] == pytest.approx(
        [0.04, 0.08, 0.12, 0.16, 0.2]
    )
    plain = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.2)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(plain, 40)
    expected = []
    for _ in range(40):
        expected.append(plain.param_groups[0]["lr"])
        plain.step()
        cosine.step()
    assert _rates(TrainConfig(epochs=4, lr=0.2), 10) == expected


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"warmup_epochs": -1},
            "warmup_epochs=-1 cannot be used: expected a number of epochs >= 0",
        ),
        ({"warmup_epochs": float("nan")}, "warmup_epochs=nan"),
        ({"warmup_epochs": 1, "schedule": "onecycle"}, "which warms up itself"),
        ({"warmup_epochs": 3, "epochs": 3}, "leaves none of the 3 epochs"),
    ],
)
def test_a_bad_warmup_is_refused_in_one_line(settings, message):
    from autosearch import ConfigError

    with pytest.raises(ConfigError, match=message) as error:
        TrainConfig(**settings)
    assert "\n" not in str(error.value)


def test_a_warmed_up_run_resumes_from_its_checkpoint_as_if_never_stopped(
    tiny_space, digits, tmp_path
):
    class Stop(Exception):
        pass

    def stop_after_two(epoch):
        if epoch.epoch == 2:
            raise Stop

    config = TrainConfig(epochs=3, lr=0.1, warmup_epochs=1.5)
    straight = _model(tiny_space, digits)
    expected = train(straight, digits, config, seed=2)
    path = tmp_path / "run.pt"
    with pytest.raises(Stop):
        train(
            _model(tiny_space, digits),
            digits,
            config,
            seed=2,
            checkpoint=path,
            on_epoch=stop_after_two,
        )
    resumed = _model(tiny_space, digits, seed=9)
    result = train(resumed, digits, config, seed=2, checkpoint=path)
    assert [e.epoch for e in result.history] == [1, 2, 3]
    assert result.val_accuracy == expected.val_accuracy > 0.5
    for (name, a), b in zip(
        straight.state_dict().items(), resumed.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name


# auto_batch_size's rule (issue 45, 3): it chose 4,096 from 256 and diverged (22.5 %).
class _Images:
    def __init__(self, n: int) -> None:
        self.train = range(n)


@pytest.mark.parametrize(
    ("images", "batch", "cap"),
    [(48_000, 256, 512), (1_000_000, 256, 2048), (1_000, 64, 64), (48_000, 64, 512)],
)
def test_auto_batch_size_grows_at_most_eightfold_and_keeps_fifty_steps_an_epoch(images, batch, cap):
    from autosearch.training._batch import MAX_GROWTH, MIN_STEPS, batch_cap

    found = batch_cap(TrainConfig(batch_size=batch), _Images(images))
    assert found == cap
    assert found <= batch * MAX_GROWTH and (found == batch or images // found >= MIN_STEPS)


def test_a_grown_batch_scales_the_rate_warms_up_and_says_why_it_stopped():
    from autosearch.training._batch import grown

    config = TrainConfig(epochs=10, batch_size=256, lr=0.1)
    chosen, said = grown(config, 512, cap=512, images=48_000)
    assert (chosen.batch_size, chosen.lr, chosen.warmup_epochs) == (512, 0.2, 2.0)
    assert said == (
        "batch 512 (grown 2x from 256; no further: at least 50 steps an epoch of 48000 "
        "images), learning rate 0.1 -> 0.2 (linear rule), warmed up over 2 epochs"
    )
    _, said = grown(config, 1024, cap=2048, images=10**6)
    assert "no further: the GPU's memory" in said
    _, said = grown(config, 2048, cap=2048, images=10**6)
    assert "no further: at most 8x the configured batch" in said
    onecycle = TrainConfig(epochs=10, batch_size=256, lr=0.1, schedule="onecycle")
    assert grown(onecycle, 512, cap=512, images=48_000)[0].warmup_epochs == 0  # its own
    asked = TrainConfig(epochs=10, batch_size=256, lr=0.1, warmup_epochs=3)
    assert grown(asked, 512, cap=512, images=48_000)[0].warmup_epochs == 3
    same, said = grown(config, 256, cap=512, images=48_000)
    assert same == config and "no further: the GPU's memory" in said
