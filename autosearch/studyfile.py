"""Study files: Python files under ``studies/`` that declare one :class:`StudySpec`."""

from __future__ import annotations

import dataclasses
import runpy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from autosearch._files import NotReadable, check_regular
from autosearch.compress import Compression
from autosearch.controller import Controller
from autosearch.errors import ConfigError, StudyFileError
from autosearch.evaluation.proxies import ProxyConfig
from autosearch.evaluation.tabular import Table
from autosearch.evaluation.user import Evaluator
from autosearch.space import SearchSpace
from autosearch.study import Study, create_study
from autosearch.study.opening import check_study_name
from autosearch.training.early_stopping import SuccessiveHalving
from autosearch.training.train import TrainConfig
from autosearch.weight_sharing.supernet import SupernetConfig

__all__ = ["StudySpec", "load_spec"]


@dataclass(frozen=True, kw_only=True)
class StudySpec:
    """A study's whole definition, as a study file declares it; its fields (but
    ``n_trials``) are the arguments of :func:`autosearch.create_study`.

    ``autosearch run FILE`` finds the one StudySpec in FILE, creates (or resumes) the
    study and runs it until ``n_trials`` trials have finished.

    Attributes:
        name: Study name, unique in its storage.
        controller: A controller instance (which carries its space), or a registered
            controller name together with ``space``.
        space: The search space (or a registered space's name, for its default
            configuration); optional when ``controller`` is an instance.
        data: A dataset spec (``"digits"``, ``"fashion-mnist"``, ``"cifar10:PATH"``,
            ``"folder:PATH"``...) or ``(images, labels)`` arrays; see autosearch.data.
        objectives: Objective names (autosearch.scoring.metrics), the first usually ``"accuracy"``.
        reward: The scalar single-objective controllers maximise, computed for each
            variant (a candidate's is its best variant's): ``"mnas"`` (default:
            ``accuracy × (flops / target) ** -0.07``, the target being the space's
            ``max_flops``, else its median FLOPs), ``"mnas@latency=2.5,w=-0.07"``,
            ``"hard@macs=2e6"``, ``"accuracy"`` (see autosearch.scoring).
        variants: Variants measured for each candidate: ``"base"``,
            ``"prune-l1@0.5"``, ``"prune-channels@0.5"``, ``"int8"``, ``"qat-int8"``,
            ``"distill"`` (see autosearch.compress).
        compression: How variants are derived (fine-tuning epochs, distillation,
            calibration, ``only_front``).
        train: How every candidate is trained (a candidate's searched hyperparameters
            override it, for training, its variants and its export alike).
        storage: Storage URL; default ``sqlite:///runs/NAME/study.db``.
        artifacts: Folder (or ``s3://bucket/prefix``) for trained weights and
            checkpoints; default ``artifacts/`` beside a file storage, else
            ``runs/NAME/artifacts``. Stored with the study as an absolute location,
            which every process of the study uses.
        seed: Seed of the data split and of every trial's training.
        table: Evaluate architectures by looking them up in this benchmark table
            instead of training them (``data`` and ``train`` are then unused).
        early_stopping: Stop unpromising trials early (SuccessiveHalving, Hyperband),
            judged on validation accuracy after each epoch against the other trials.
        supernet: Evaluate candidates on one weight-sharing supernet instead of training
            each (the space is then an elastic one: ``MobileNetSpace(...).supernet()``);
            ``autosearch run`` trains the supernet before the trials.
        proxies: Score every candidate with zero-cost proxies (by default the
            estimate's six: AZ-NAS's expressivity, progressivity and complexity, MeCo,
            jacob_cov and synflow; ``ProxyConfig(names=..., batch=64)``) at its
            initialization, on one batch of the training images drawn with the study's
            seed; stored with its metrics beside accuracy and costs, and ranked against
            the trained accuracy in the report.
        mlflow: Show the study live in MLflow: a tracking URI (``sqlite:///mlflow.db``,
            ``http://host:5000``), or True for MLflow's default; one run per trial,
            nested under the study's (autosearch.tracking; ``--mlflow`` on the
            command line).
        tensorboard: Show the study live in TensorBoard: a folder, one run per trial
            (``--tensorboard``).
        evaluator: Your own training or evaluation instead of autosearch's trainer: a
            function (or callable object) given each :class:`autosearch.Candidate`,
            returning its figures (autosearch.evaluation.user). Defined in the study
            file or imported by it, so that every ``autosearch run`` of the file has it.
        metrics: Figures the evaluator returns, declared as objectives with their
            direction (``{"f1": "maximize"}``), so that ``objectives`` may name them.
        n_trials: How many trials ``autosearch run`` runs the study to.
        confirm: With ``supernet``: after the search, ``autosearch run`` trains the
            ``confirm`` most accurate subnets of the supernet's front from scratch
            (``study.confirm``; fewer where the front is smaller), so that the best and
            the export it reports are confirmed by training. 0: none.
    """

    name: str
    controller: Controller | str
    space: SearchSpace | None = None
    data: str = "digits"
    objectives: tuple[str, ...] = ("accuracy", "flops")
    reward: str = "mnas"
    variants: tuple[str, ...] = ("base",)
    compression: Compression = field(default_factory=Compression)
    train: TrainConfig = field(default_factory=TrainConfig)
    storage: str | None = None
    artifacts: str | None = None
    seed: int = 0
    table: Table | None = None
    early_stopping: SuccessiveHalving | None = None
    supernet: SupernetConfig | None = None
    proxies: ProxyConfig | None = None
    mlflow: str | bool | None = None
    tensorboard: str | None = None
    evaluator: Evaluator | None = None
    metrics: Mapping[str, str] | None = None
    n_trials: int = 10
    confirm: int = 0

    def __post_init__(self) -> None:
        check_study_name(self.name)
        for name in ("n_trials", "confirm"):
            k = getattr(self, name)
            if isinstance(k, bool) or not isinstance(k, int) or k < 0:
                raise ConfigError(f"StudySpec {name} must be an integer >= 0, got {k!r}")
        k = self.confirm
        if k and self.supernet is None:
            raise ConfigError(
                f"StudySpec(confirm={k}) confirms a supernet's choice by training, but this "
                "study has no supernet=...: its trials are trained already; drop confirm="
            )

    def create(
        self,
        *,
        storage: str | None = None,
        artifacts: str | None = None,
        mlflow: str | None = None,
        tensorboard: str | None = None,
        load_if_exists: bool = True,
    ) -> Study:
        """The study (created, or continued where stored); the keywords given override
        the file's own."""
        options = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del options["name"], options["n_trials"], options["confirm"]
        options["storage"] = storage or self.storage
        options["artifacts"] = artifacts or self.artifacts
        options["mlflow"] = self.mlflow if mlflow is None else mlflow
        options["tensorboard"] = self.tensorboard if tensorboard is None else tensorboard
        return create_study(self.name, **options, load_if_exists=load_if_exists)


_EXAMPLE = (
    "study = autosearch.StudySpec(name='my-study', "
    "controller=RandomSearch(ResNetSpace(), seed=0), n_trials=20)"
)


def load_spec(path: str | Path) -> StudySpec:
    """Run the study file at ``path`` and return the one StudySpec it defines."""
    path = Path(path)
    try:
        check_regular(path)
    except NotReadable as exc:
        if exc.missing:
            raise StudyFileError(
                f"study file {path} does not exist (ready studies are in studies/)"
            ) from None
        raise StudyFileError(
            f"study file {exc}; name a Python file that declares a StudySpec"
        ) from None
    try:
        namespace = runpy.run_path(str(path))
    except SystemExit as exc:  # exit() in a study file must not end the command quietly
        raise StudyFileError(
            f"study file {path} exited while it was read (SystemExit({exc.code!r})): a study "
            "file declares a StudySpec; put work to run under `if __name__ == '__main__':`"
        ) from None
    except Exception as exc:
        raise StudyFileError(
            f"study file {path} failed to run: {type(exc).__name__}: {exc}"
        ) from None
    specs = {name: v for name, v in namespace.items() if isinstance(v, StudySpec)}
    if not specs:
        raise StudyFileError(f"study file {path} defines no study; add a line such as {_EXAMPLE}")
    if len(specs) > 1:
        raise StudyFileError(
            f"study file {path} defines {len(specs)} studies ({', '.join(sorted(specs))}); "
            "keep one per file"
        )
    return next(iter(specs.values()))
