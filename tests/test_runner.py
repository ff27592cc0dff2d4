"""The runner owns a whole trial: training, variants, costs and rewards, with the
candidate's own training settings applied everywhere."""

from __future__ import annotations

import pytest

import autosearch
import autosearch.compress
from autosearch import Compression, TrainConfig
from autosearch.compress import parse_variants
from autosearch.evaluation.runner import TrialContext, TrialPlan, run_trial
from autosearch.scoring import parse_reward
from controllers import RandomSearch
from search_spaces import HyperparameterSpace


@pytest.fixture
def hyper(tiny_space):
    """Every candidate trains with AdamW at lr 0.003 and batch 32, which the study's
    TrainConfig (SGD, lr 0.1, batch 128) does not."""
    return HyperparameterSpace(
        space=tiny_space,
        lr=(0.003,),
        optimizer=("adamw",),
        batch_size=(32,),
        weight_decay=(),
        label_smoothing=(),
    )


def _spy_finetune(monkeypatch) -> list[TrainConfig]:
    seen: list[TrainConfig] = []
    real = autosearch.compress._finetune

    def spy(model, data, config, *args, **kwargs):
        seen.append(config)
        return real(model, data, config, *args, **kwargs)

    monkeypatch.setattr(autosearch.compress, "_finetune", spy)
    return seen


def test_a_candidates_own_hyperparameters_fine_tune_its_variants_and_its_export(
    hyper, tmp_path, monkeypatch
):
    seen = _spy_finetune(monkeypatch)
    study = autosearch.create_study(
        "hp",
        controller=RandomSearch(hyper, seed=0),
        variants=("base", "prune-l1@0.5"),
        compression=Compression(finetune_epochs=1),
        train=TrainConfig(epochs=1, batch_size=128, lr=0.1, optimizer="sgd"),
        storage=f"sqlite:///{tmp_path}/hp.db",
    )
    (record,) = study.optimize(1)
    assert record.state == "complete"
    assert [(c.optimizer, c.lr, c.batch_size) for c in seen] == [("adamw", 0.003, 32)]
    variant = study.record(record.trial, "prune-l1@0.5")
    study.export(variant, tmp_path / "export")
    assert [(c.optimizer, c.lr, c.batch_size) for c in seen[1:]] == [("adamw", 0.003, 32)]


def test_a_trial_result_holds_every_point_scored(tiny_space, digits, tmp_path):
    arch = tiny_space.default()
    plan = TrialPlan(
        space=tiny_space,
        arch=arch,
        train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
        reward=parse_reward("mnas@flops=1e5"),
        variants=parse_variants(["base", "prune-channels@0.5"]),
        compression=Compression(finetune_epochs=1),
        work=tmp_path / "attempt",
    )
    epochs = []

    class Watch(TrialContext):
        def epoch_done(self, epoch):
            epochs.append(epoch.epoch)

    result = run_trial(plan, digits, Watch())
    assert epochs == [1] and result.status == "complete"
    assert [p.name for p in result.points] == ["base", "prune-channels@0.5"]
    for point in result.points:
        m = point.metrics
        assert m["reward"] == pytest.approx(m["accuracy"] * (m["flops"] / 1e5) ** -0.07)
    # Base and variant points carry the same measured keys (a variant adds its own).
    base, variant = (set(p.metrics) for p in result.points)
    assert base - {"train_seconds", "world_size", "latency_predicted"} <= variant
    best = max(result.points, key=lambda p: p.metrics["reward"])
    assert result.best is best
    outcome = result.outcome(("accuracy", "flops"))
    assert outcome.reward == best.metrics["reward"]
    assert outcome.objectives == {k: best.metrics[k] for k in ("accuracy", "flops")}


def test_a_failed_variant_leaves_the_trial_and_the_others(tiny_space, digits, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this layer")

    monkeypatch.setitem(autosearch.compress._DERIVERS, "prune-l1", broken)
    plan = TrialPlan(
        space=tiny_space,
        arch=tiny_space.default(),
        train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
        variants=parse_variants(["prune-l1@0.5", "int8"]),
    )
    result = run_trial(plan, digits)
    names = {p.name: p for p in result.points}
    assert names["prune-l1@0.5"].failed and "no kernel" in names["prune-l1@0.5"].reason
    int8 = names["int8"]
    assert not int8.failed and {"accuracy", "bytes", "reward"} <= set(int8.metrics)
    assert result.best.name in ("base", "int8")


def test_early_stopping_ends_a_trial_with_its_cost(tiny_space, digits):
    from autosearch.training.early_stopping import SuccessiveHalving

    class Behind(TrialContext):  # three peers all better at epoch 1
        def peers(self):
            return {n: {1: 1.0} for n in range(3)}

    plan = TrialPlan(
        space=tiny_space,
        arch=tiny_space.default(),
        train=TrainConfig(epochs=3, batch_size=128, lr=0.1),
        early_stopping=SuccessiveHalving(min_epochs=1, reduction=3),
    )
    result = run_trial(plan, digits, Behind())
    assert result.status == "stopped" and result.model is None
    metrics = result.base.metrics
    assert metrics["stopped_at_epoch"] == 1 and metrics["flops"] > 0 and "reward" in metrics
    assert result.outcome(("accuracy",)).status == "stopped"
