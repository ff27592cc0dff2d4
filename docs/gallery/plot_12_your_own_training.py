"""
Your own training
=================

A study normally trains each candidate with autosearch's trainer. Give it your own
function instead (``evaluator=``): it receives each candidate's network, built for the
data and initialised with the trial's seed, trains it however you like (your loss, your
optimizer, your loop or a Lightning ``Trainer``), reports each epoch, and returns the
figures it measured. The rest stays the study's: the controller, the storage, the
workers, early stopping, resume after a kill, the report and the export.
"""

# %%
# An evaluator is a function of a candidate
# -----------------------------------------
# Here, in a module of its own (``my_training.py``), so that worker processes started
# from the command line import it too: AdamW and label smoothing instead of the study's
# SGD, a checkpoint saved every epoch and loaded when a killed trial is resumed, each
# epoch reported (the study records the curve; early stopping and Ctrl-C act there).
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

folder = Path(tempfile.mkdtemp())
(folder / "my_training.py").write_text(
    textwrap.dedent(
        """
        import torch
        import torch.nn.functional as F


        def accuracy(model, split, data):
            model.eval()
            with torch.no_grad():
                predicted = model(data.normalize(split.x.float())).argmax(1)
            return float((predicted == split.y).float().mean())


        def evaluate(candidate):
            model, data = candidate.model, candidate.data
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
            start, kept = 1, candidate.load()
            if kept is not None:  # this trial was cut: go on from its last epoch
                model.load_state_dict(kept["model"])
                optimizer.load_state_dict(kept["optimizer"])
                start = kept["epoch"] + 1
            order = torch.Generator().manual_seed(candidate.seed)
            x, y = data.normalize(data.train.x.float()), data.train.y
            for epoch in range(start, candidate.config.epochs + 1):
                model.train()
                for batch in torch.randperm(len(y), generator=order).split(64):
                    optimizer.zero_grad()
                    loss = F.cross_entropy(model(x[batch]), y[batch], label_smoothing=0.1)
                    loss.backward()
                    optimizer.step()
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                candidate.save({**state, "epoch": epoch})
                candidate.report(epoch, accuracy(model, data.val, data))
            return {
                "accuracy": accuracy(model, data.val, data),
                "test_accuracy": accuracy(model, data.test, data),
            }
        """
    )
)
sys.path.insert(0, str(folder))
import my_training

# %%
# A study that trains with it
# ---------------------------
# ``evaluator=`` is all it takes; the study counts each network's FLOPs, parameters and
# latency itself, scores it and tells the controller, as for its own trainer.
import autosearch
from controllers import RegularizedEvolution
from search_spaces import ResNetSpace

space = ResNetSpace(min_stages=2, max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8,))
storage = f"sqlite:///{folder}/study.db"
study = autosearch.create_study(
    "own-training",
    controller=RegularizedEvolution(space, seed=0),
    data="digits",
    evaluator=my_training.evaluate,
    train=autosearch.TrainConfig(epochs=3),  # the evaluator reads candidate.config.epochs
    storage=storage,
)
study.optimize(3, show_progress_bar=False)
table = study.records_dataframe()
columns = ["trial", "description", "metrics_accuracy", "metrics_flops", "metrics_params"]
print(table[columns].to_string(index=False))

# %%
# Two workers, one of them killed
# -------------------------------
# Workers started from the command line name the evaluator (a stored study never imports
# code by itself): ``autosearch worker --evaluator my_training:evaluate``. The first is
# killed once it holds a trial one epoch in; the second takes that trial up from the
# evaluator's last checkpoint, then goes on with its own.
worker = [
    sys.executable,
    "-m",
    "autosearch.cli",
    "worker",
    "--study",
    "own-training",
    "--storage",
    storage,
    "--evaluator",
    "my_training:evaluate",
    "--n-trials",
    "2",
]
first = subprocess.Popen(worker, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def one_epoch_in():
    running = [
        t
        for t in study.optuna_study.get_trials(deepcopy=False)
        if t.state.name == "RUNNING" and t.intermediate_values
    ]
    return running[0] if running else None


while (cut := one_epoch_in()) is None and first.poll() is None:
    time.sleep(0.05)
os.kill(first.pid, signal.SIGKILL)
first.wait()
print("killed the worker holding trial", cut.number if cut else None)
second = subprocess.run(worker, cwd=folder, capture_output=True, text=True)
print(second.stdout.strip().splitlines()[-1])
for record in study.records(variants=False):
    print(record.trial, record.state, f"{record.accuracy:.3f}", record.description)
# The trial that took the cut one up says so; its curve goes on from the cut one's.
for t in study.optuna_study.get_trials():
    if "resumes" in t.user_attrs:
        print(f"trial {t.number} resumes trial {t.user_attrs['resumes']}:", t.intermediate_values)

# %%
# Or ask and tell, from a loop of your own
# ----------------------------------------
# Where your code runs the loop, ask the study for a candidate and tell it the figures;
# the controller learns from them as from any trial, in the same study.
trial = study.ask()
model = trial.build()
print("asked:", trial.number, trial.description)
candidate_figures = {"accuracy": my_training.accuracy(model, study.data.val, study.data)}
record = study.tell(trial, candidate_figures, model=model)  # untrained: a poor one
print("told:", record.trial, record.state, f"{record.accuracy:.3f}")
