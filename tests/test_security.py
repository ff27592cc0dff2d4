"""Every load path reads data, never code: safetensors, JSON, torch.load with
weights_only=True, and a restricted unpickler for CIFAR's python batches. (Study files
and an export's model.py are Python the user wrote or exported, run on purpose.) What a
stored study or a bucket may name is tested in test_integrity.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    p
    for folder in ("autosearch", "search_spaces", "controllers")
    for p in (ROOT / folder).rglob("*.py")
)


def _calls(path: Path) -> list[tuple[str, ast.Call]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            found.append((ast.unparse(node.func), node))
    return found


def test_no_load_path_can_run_code():
    offenders = []
    for path in SOURCES:
        for name, call in _calls(path):
            keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
            where = f"{path.relative_to(ROOT)}:{call.lineno} {name}"
            if name in {"pickle.load", "pickle.loads", "marshal.loads", "yaml.load", "eval"}:
                offenders.append(where)
            if name == "torch.load" and keywords.get("weights_only") != "True":
                offenders.append(where + " without weights_only=True")
            if name.endswith("np.load") and keywords.get("allow_pickle") == "True":
                offenders.append(where + " with allow_pickle=True")
    assert not offenders, offenders


def test_the_only_unpicklers_are_the_restricted_ones():
    users = [p.relative_to(ROOT).as_posix() for p in SOURCES if "Unpickler" in p.read_text()]
    assert users == ["autosearch/data/_readers.py", "autosearch/training/_shard_reader.py"]


def test_sharded_checkpoints_are_read_by_the_restricted_reader_only():
    """DCP's own reader unpickles a folder's metadata and its planner loads values with
    weights_only=False: every load passes the restricted pair (test_checkpoint_reads)."""
    loads = []
    for path in SOURCES:
        for name, call in _calls(path):
            if name.split(".")[-1] in {"load", "load_state_dict"} and "dcp" in name:
                keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
                loads.append((path.name, keywords.get("storage_reader"), keywords.get("planner")))
    assert loads == [("sharding.py", "reader", "planner")]
    text = (ROOT / "autosearch/training/sharding.py").read_text()
    assert "_shard_reader.SafeReader(folder), _shard_reader.SafeLoadPlanner()" in text


class _Payload:
    def __reduce__(self):
        return (print, ("pwned",))


@pytest.mark.parametrize("kind", ["smuggled code", "random bytes"])
def test_an_unreadable_checkpoint_is_set_aside_never_run(kind, tmp_path, digits, capfd, caplog):
    from autosearch import TrainConfig
    from autosearch.training.train import train

    checkpoint = tmp_path / "run.pt"
    if kind == "smuggled code":
        torch.save({"epoch": 1, "model": _Payload()}, checkpoint)
    else:
        checkpoint.write_bytes(bytes(range(256)) * 40)
    before = checkpoint.read_bytes()
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    result = train(model, digits, TrainConfig(epochs=2), seed=0, checkpoint=checkpoint)
    assert [e.epoch for e in result.history] == [1, 2]  # trained from scratch
    assert "pwned" not in capfd.readouterr().out
    aside = tmp_path / "run.pt.unreadable"
    assert aside.read_bytes() == before  # kept for a look, out of the way
    assert "cannot be read" in caplog.text and "weights_only" not in caplog.text
    assert torch.load(checkpoint, weights_only=True)["epoch"] == 2  # a new, good one
