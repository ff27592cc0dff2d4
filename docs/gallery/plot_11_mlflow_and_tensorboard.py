"""
Watching a study in MLflow and TensorBoard
==========================================

A study can show itself, while it runs, where experiments are usually watched: MLflow
(one experiment per study, one run per trial nested under the study's run) and
TensorBoard (a folder per trial). Every process that trains the study's trials writes
its own, workers on other machines included, since the setting is stored with the
study. A tracker that is down or slow costs a trial nothing but one line in the log.
"""

# %%
# A small study with MLflow and TensorBoard on
# --------------------------------------------
# ``mlflow=`` takes any tracking URI (``True``: MLflow's default, ``sqlite:///mlflow.db``
# where the study is created; a server's ``http://host:5000``); ``tensorboard=`` a
# folder. The same switches are ``--mlflow URI`` and ``--tensorboard DIR`` on the
# command line, and ``study.track(...)`` on a study made without them.
import tempfile
from pathlib import Path

import autosearch
from controllers import RandomSearch
from search_spaces import ResNetSpace

folder = Path(tempfile.mkdtemp())
space = ResNetSpace(min_stages=2, max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8,))
study = autosearch.create_study(
    "watched",
    controller=RandomSearch(space, seed=0),
    data="digits",
    variants=("base", "int8"),
    train=autosearch.TrainConfig(epochs=3, batch_size=64, lr=0.1),
    storage=f"sqlite:///{folder}/study.db",
    mlflow=f"sqlite:///{folder}/mlflow.db",
    tensorboard=str(folder / "tensorboard"),
)
print(study.tracking)
study.optimize(3)

# %%
# The runs, read back with MLflow's own client
# --------------------------------------------
# What ``mlflow ui --backend-store-uri sqlite:///…/mlflow.db`` shows: the study's run,
# and under it a run per trial with its genes and training settings as parameters, its
# epochs as step metrics, every variant's figures (``int8.accuracy``), its state and
# its ``arch.json``.
from mlflow.tracking import MlflowClient

client = MlflowClient(tracking_uri=study.tracking.mlflow)
experiment = client.get_experiment_by_name("watched")
for run in client.search_runs([experiment.experiment_id], order_by=["attributes.start_time"]):
    tags, metrics = run.data.tags, run.data.metrics
    if tags.get("autosearch.role") == "study":
        print("study run:", run.info.run_name, dict(run.data.params))
        continue
    curve = client.get_metric_history(run.info.run_id, "val_accuracy")
    # int8 is estimated during the search (fake quantization): ``int8.accuracy_estimate``;
    # the front's points are then measured for real, logged as ``int8.accuracy``.
    int8 = metrics.get("int8.accuracy", metrics["int8.accuracy_estimate"])
    print(
        f"{run.info.run_name}: {run.info.status}, stages {run.data.params['stages']}, "
        f"lr {run.data.params['train.lr']}, val accuracy by epoch "
        f"{[round(m.value, 3) for m in curve]}, int8 {int8:.3f} "
        f"({tags['autosearch.figures.int8']}), {metrics['flops']:.3g} FLOPs, artifacts "
        f"{[a.path for a in client.list_artifacts(run.info.run_id)]}"
    )

# %%
# The same trials in TensorBoard
# ------------------------------
# ``tensorboard --logdir FOLDER`` shows each trial's training loss and validation
# accuracy per epoch, its hyperparameters beside its final figures (the HPARAMS tab),
# and the Pareto front as accuracy over FLOPs. The event files, read back:
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

for board in sorted((folder / "tensorboard" / "watched").iterdir()):
    events = EventAccumulator(str(board))
    events.Reload()
    print(board.name, sorted(events.Tags()["scalars"]))
