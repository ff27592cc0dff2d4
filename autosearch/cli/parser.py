"""The ``autosearch`` command line's commands and options, and their checks: a count
or a budget out of range is refused by the parser, in one line (exit status 2)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any, NoReturn

from autosearch.cli.export import cmd_export
from autosearch.cli.report import cmd_report
from autosearch.cli.rerun import cmd_rerun
from autosearch.cli.run import cmd_run
from autosearch.cli.search import cmd_search
from autosearch.cli.status import cmd_status
from autosearch.cli.supernet import cmd_supernet
from autosearch.cli.train import cmd_train
from autosearch.cli.worker import cmd_worker
from autosearch.errors import ConfigError, UnknownNameError
from autosearch.evaluation.proxies import PROXIES, ProxyConfig
from autosearch.registry import controllers, spaces

__all__ = ["build_parser"]

DESCRIPTION = "Neural architecture search with every candidate trained for real."


class _Help(argparse.HelpFormatter):
    """Help that shows each option's default, where it has one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        unset = default is None or default is False or default == {} or default == argparse.SUPPRESS
        if unset or "default" in text:
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, like every other autosearch error (exit status 2); help
    with defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


_LARGEST = 2**31 - 1  # trial numbers, seeds and counts: what storages and RNGs take


def _integer(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not (text.lstrip("-").isascii() and text.lstrip("-").isdigit()) or int(text) < least:
            raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {text!r}")
        if int(text) > _LARGEST:
            raise argparse.ArgumentTypeError(
                f"expected an integer from {least} to {_LARGEST}, got {text[:40]!r}"
            )
        return int(text)

    return parse


TIMEOUT_HELP = (
    "a time budget: no trial starts after SECONDS (one running then finishes); the trial "
    "count holds too"
)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number > 0 (e.g. 5e6), got {text!r}")
    return value


_TABLE_COLUMNS = ("key", "accuracy", "test_accuracy", "train_time")


def _columns(text: str) -> dict[str, str]:
    """``key=arch,accuracy=val_acc`` → Table column names."""
    pairs = [part.partition("=") for part in text.split(",") if part]
    names = {name.strip(): column.strip() for name, eq, column in pairs if eq and column}
    if len(names) != len(pairs) or set(names) - set(_TABLE_COLUMNS):
        raise argparse.ArgumentTypeError(
            f"expected NAME=COLUMN pairs, NAME among {', '.join(_TABLE_COLUMNS)}; got {text!r}"
        )
    return names


def _proxies(text: str) -> ProxyConfig:
    """``synflow,naswot``, ``default`` (the zero-cost estimate's) or ``all`` → the
    study's zero-cost proxies."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    try:
        if text == "default":
            return ProxyConfig()
        return ProxyConfig(names=tuple(PROXIES) if text == "all" else names)
    except (ConfigError, UnknownNameError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="autosearch",
        description=DESCRIPTION,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log each trial")
    sub = parser.add_subparsers(dest="command", required=True)
    adders = (_add_run, _add_supernet, _add_search, _add_reading, _add_worker, _add_train)
    for add in (*adders, _add_latency, _add_confirm, _add_population):
        add(sub)
    return parser


Subparsers = Any  # argparse's _SubParsersAction: private, so not named in signatures
STORAGE_HELP = "storage URL (default sqlite:///runs/NAME/study.db)"
JSON_HELP = "machine-readable output"
ARTIFACTS_HELP = (
    "where a new study keeps weights and checkpoints: a folder every worker reaches, or "
    "s3://bucket/prefix (default: artifacts/ beside a file storage, else runs/NAME/artifacts); "
    "stored with the study, and used by every process of it"
)


def _add_tracking(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mlflow",
        metavar="URI",
        help="show the study live in MLflow at this tracking URI (sqlite:///mlflow.db, "
        "http://host:5000); stored with the study, for every worker",
    )
    parser.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="show the study live in TensorBoard: event files under DIR; stored with the study",
    )


def _add_run(sub: Subparsers) -> None:
    run = sub.add_parser("run", help="run a study file until its trial budget is spent")
    run.add_argument("study_file")
    run.add_argument(
        "--n-trials", type=_integer(0), help="total trials (default: the file's n_trials)"
    )
    run.add_argument("--timeout", type=_positive, metavar="SECONDS", help=TIMEOUT_HELP)
    run.add_argument(
        "--storage", help="storage URL (default: the file's, or sqlite:///runs/NAME/study.db)"
    )
    run.add_argument("--out", help="folder for report.html and best/ (default runs/NAME)")
    run.add_argument(
        "--no-export",
        dest="export",
        action="store_false",
        help="end without exporting the best into best/ (one of several workers of a study, "
        "say); `autosearch export` writes it later",
    )
    run.add_argument("--artifacts", help=ARTIFACTS_HELP)
    _add_tracking(run)
    run.add_argument(
        "--workers",
        type=_integer(1),
        default=1,
        help="worker processes sharing the trials (placed by --executor)",
    )
    run.add_argument(
        "--executor",
        choices=("process", "ray", "slurm"),
        default="process",
        help="where workers run: processes here, Ray tasks, or a Slurm job array",
    )
    run.add_argument(
        "--ray-address", help="the Ray cluster (with --executor ray; default RAY_ADDRESS)"
    )
    run.add_argument(
        "--per-gpu",
        type=_integer(1),
        help="workers sharing one GPU, instead of the placement rule's count (a trial's size "
        "against the GPU's free memory); with --executor process or ray",
    )
    run.add_argument(
        "--nproc-per-node",
        type=_integer(1),
        default=1,
        help="train each trial with N DDP processes (torchrun; gloo on CPU)",
    )
    run.set_defaults(func=cmd_run)


def _add_latency(sub: Subparsers) -> None:
    from autosearch.cli.latency import cmd_latency_table

    found = sub.add_parser(
        "latency-table",
        help="measure this device's latency lookup table for a study file's space "
        "(then Compression(latency=FILE) on the study's machine)",
    )
    found.add_argument("study_file")
    found.add_argument("--out", required=True, help="the table's JSON file (added to if there)")
    found.add_argument("--samples", type=int, default=300, help="architectures drawn")
    found.add_argument("--seed", type=int, default=0)
    found.add_argument("--json", action="store_true", help=JSON_HELP)
    found.set_defaults(func=cmd_latency_table)


def _add_confirm(sub: Subparsers) -> None:
    from autosearch.cli.confirm import cmd_confirm

    confirm = sub.add_parser(
        "confirm",
        help="train the top K subnets of a supernet study's front from scratch, as trials "
        "of the study, and compare inherited with confirmed accuracy",
    )
    confirm.add_argument("study_file")
    confirm.add_argument("-k", type=_integer(1), default=3, help="subnets to confirm")
    confirm.add_argument(
        "--ranker",
        action="store_true",
        help="choose each subnet where a ranker fitted on the confirmations before it is "
        "least sure among its top (supernet accuracy, proxies, FLOPs, parameters, the "
        "architecture); default: the front's K most accurate. Measured to pick better "
        "from about 20 confirmations on NAS-Bench-201, alike below",
    )
    confirm.add_argument(
        "--population",
        type=_integer(2),
        help="train each as a population of N, the learning rate adapted while they train "
        "(population-based training); the best confirms the subnet",
    )
    confirm.add_argument(
        "--population-interval",
        type=_integer(1),
        default=2,
        help="epochs between a population's exploit / explore rounds (default 2)",
    )
    confirm.add_argument("--storage", help=STORAGE_HELP)
    confirm.add_argument("--json", action="store_true", help=JSON_HELP)
    confirm.set_defaults(func=cmd_confirm)


def _add_population(sub: Subparsers) -> None:
    from autosearch.cli.population import cmd_population

    population = sub.add_parser(
        "population",
        help="train a study's best architecture (or a trial's) as a population, the "
        "learning rate adapted while it trains, as a trial of the study",
    )
    population.add_argument("study_file")
    population.add_argument(
        "--size", type=_integer(2), default=8, help="members trained together (default 8)"
    )
    population.add_argument(
        "--interval",
        type=_integer(1),
        default=2,
        help="epochs between exploit / explore rounds (default 2); the learning rate "
        "adapts within 1/10 to 10 times the study's",
    )
    population.add_argument(
        "--trial", type=_integer(0), help="train this trial's architecture (default: the best)"
    )
    population.add_argument("--storage", help=STORAGE_HELP)
    population.add_argument("--json", action="store_true", help=JSON_HELP)
    population.set_defaults(func=cmd_population)


def _add_supernet(sub: Subparsers) -> None:
    supernet = sub.add_parser(
        "supernet", help="train a study file's weight-sharing supernet (resumes a cut run)"
    )
    supernet.add_argument("study_file")
    supernet.add_argument("--storage", help=STORAGE_HELP)
    supernet.add_argument("--artifacts", help=ARTIFACTS_HELP)
    supernet.add_argument(
        "--nproc-per-node", type=_integer(1), default=1, help="train with N processes (DDP)"
    )
    supernet.add_argument(
        "--retrain",
        action="store_true",
        help="train it again if its stored weights are missing or damaged",
    )
    supernet.add_argument("--json", action="store_true", help=JSON_HELP)
    supernet.set_defaults(func=cmd_supernet)


def _add_search(sub: Subparsers) -> None:
    search = sub.add_parser("search", help="search a registered space with a registered controller")
    add = search.add_argument
    add("name", help="study name")
    add("--space", required=True, help=f"one of: {', '.join(spaces.names())}")
    add("--controller", default="random", help=f"one of: {', '.join(controllers.names())}")
    add("--n-trials", type=_integer(0), default=10, help="total trials")
    add(
        "--data",
        default="digits",
        help="dataset: digits, fashion-mnist[:PATH], mnist:PATH, cifar10:PATH, folder:PATH",
    )
    add("--epochs", type=int, default=10, help="training epochs per trial")
    add("--table", help="evaluate by looking up this benchmark table (CSV/JSON)")
    add(
        "--table-columns",
        type=_columns,
        default={},
        help="the table's column names, e.g. key=arch,accuracy=val_acc,test_accuracy=test_acc,"
        "train_time=seconds (defaults: arch, val_accuracy, test_accuracy, train_time)",
    )
    add("--objectives", default="accuracy,flops", help="comma-separated")
    add(
        "--variants",
        default="base",
        help="comma-separated variants measured per candidate, e.g. base,prune-channels@0.5,int8",
    )
    add("--reward", default="mnas", help="mnas, mnas@flops=5e6, hard@macs=2e6 or accuracy")
    add("--max-flops", type=_positive, help="budget: FLOPs (2 x MACs) per image of --data")
    add("--max-params", type=_positive, help="budget: parameters")
    add("--seed", type=_integer(0), default=0, help="seed of the controller and trials")
    add(
        "--proxies",
        type=_proxies,
        help="zero-cost proxies of every candidate: 'default' (the estimate's: "
        f"{','.join(ProxyConfig().names)}), 'all' ({','.join(PROXIES)}) or names, "
        "comma-separated; --controller zero_cost starts from the pool they rank best",
    )
    add("--storage", help=STORAGE_HELP)
    add("--artifacts", help=ARTIFACTS_HELP)
    add("--out", help="folder for report.html and best/ (default runs/NAME)")
    search.set_defaults(func=cmd_search)


def _reading(
    sub: Subparsers, name: str, help: str, func: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """A command that reads a stored study, named by a study file or --study."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help)
    p.add_argument("study_file", nargs="?", help="a study file naming the study")
    p.add_argument("--study", help="study name (instead of a study file)")
    p.add_argument("--storage", help=STORAGE_HELP)
    p.set_defaults(func=func)
    return p


def _add_reading(sub: Subparsers) -> None:
    status = _reading(sub, "status", "trial counts and the Pareto front", cmd_status)
    status.add_argument("--json", action="store_true", help=JSON_HELP)
    report = _reading(sub, "report", "write the HTML report (works offline)", cmd_report)
    report.add_argument("--out", help="HTML path (default runs/NAME/report.html)")
    report.add_argument("--json", action="store_true", help=JSON_HELP)
    export = _reading(
        sub, "export", "export a trained architecture (model.py + weights)", cmd_export
    )
    which = export.add_mutually_exclusive_group()
    which.add_argument("--trial", type=_integer(0), help="trial number")
    which.add_argument("--best", action="store_true", help="the most accurate trial (default)")
    export.add_argument("--max-flops", type=_positive, help="with --best: FLOPs budget (2 x MACs)")
    export.add_argument(
        "--variant",
        help="a measured variant (base, int8, prune-channels@0.5, ...; default base), "
        "derived again from the trial's weights",
    )
    export.add_argument("--out", help="export folder (default runs/NAME/export)")
    export.add_argument(
        "--finetune",
        type=_integer(0),
        help="fine-tune the exported network this many epochs first (a supernet's subnet)",
    )
    export.add_argument(
        "--mlflow",
        metavar="URI",
        nargs="?",
        const=True,
        help="log the export as an MLflow model in its trial's run, at this tracking URI "
        "(without one: where the study is tracked, else MLflow's default)",
    )
    export.add_argument(
        "--register", metavar="NAME", help="with --mlflow: register the model under NAME"
    )
    export.add_argument("--json", action="store_true", help=JSON_HELP)
    rerun = _reading(
        sub,
        "rerun",
        "retrain a trial with its seed; compare with the stored result",
        cmd_rerun,
    )
    rerun.add_argument("--trial", type=_integer(0), required=True, help="trial number")
    rerun.add_argument("--json", action="store_true", help=JSON_HELP)


def _add_worker(sub: Subparsers) -> None:
    worker = sub.add_parser("worker", help="join a stored study from any machine and run trials")
    worker.add_argument("--study", required=True, help="study name")
    worker.add_argument("--storage", required=True, help="storage URL the study lives in")
    worker.add_argument("--n-trials", type=_integer(0), default=10, help="trials this worker runs")
    worker.add_argument("--timeout", type=_positive, metavar="SECONDS", help=TIMEOUT_HELP)
    worker.add_argument(
        "--evaluator",
        metavar="MODULE:NAME",
        help="the study's own evaluator, imported from MODULE (a study created with one "
        "needs it to run trials; the stored study names it)",
    )
    worker.add_argument(
        "--total",
        type=_integer(0),
        help="stop once the study holds this many trials, every worker's counted (as "
        "`autosearch run` runs a study file's n_trials)",
    )
    worker.add_argument(
        "--max-failures",
        type=_integer(1),
        default=10,
        help="stop after this many failures in a row",
    )
    _add_tracking(worker)
    worker.set_defaults(func=cmd_worker)


def _add_train(sub: Subparsers) -> None:
    full = sub.add_parser("train", help="train an export folder from scratch, in full")
    add = full.add_argument
    add("export_dir", help="a folder written by `autosearch export`")
    recipe = " (default: the export's trial's)"
    add("--data", help="dataset spec" + recipe)
    add("--epochs", type=int, help="epochs" + recipe)
    add("--batch-size", type=int, help="images per step" + recipe)
    add("--lr", type=float, help="peak learning rate" + recipe)
    add("--precision", help="auto, fp32, bf16 or fp16" + recipe)
    add("--crop-padding", type=int, help="random-crop padding, 0: off" + recipe)
    add("--flip", action=argparse.BooleanOptionalAction, help="random horizontal flips" + recipe)
    add("--seed", type=_integer(0), help="seed of the split and training" + recipe)
    add("--nproc-per-node", type=_integer(1), default=1, help="train with N processes (DDP)")
    add(
        "--parallel",
        choices=("ddp", "fsdp", "hsdp"),
        help="how the N processes share the model: whole copies (ddp), sharded over all "
        "(fsdp), sharded within groups of --shard-size and replicated across (hsdp)" + recipe,
    )
    add(
        "--shard-size",
        type=_integer(1),
        help="ranks a group under --parallel hsdp (default: a node's)",
    )
    add(
        "--population",
        type=_integer(2),
        help="train N copies together as a population, the learning rate adapted while "
        "they train (population-based training); the best is kept",
    )
    add(
        "--population-interval",
        type=_integer(1),
        default=2,
        help="epochs between a population's exploit / explore rounds (default 2)",
    )
    add("--schedule", help="replay a population's schedule.json (the same network again)")
    add("--json", action="store_true", help="print the metrics as JSON")
    full.set_defaults(func=cmd_train)
