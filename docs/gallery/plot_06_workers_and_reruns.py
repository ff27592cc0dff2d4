"""
Many workers, crashes and reruns
================================

One study, many workers: every worker opens the study from its storage, and the storage
decides who trains what. A worker that dies leaves a trial whose heartbeat goes silent;
the next worker resumes it from its last epoch's checkpoint. A candidate that fails is
recorded with its reason, and the search goes on.
"""

# %%
# Two worker processes on one study
# ---------------------------------
# A study made here; then two ``autosearch worker`` processes join it through its
# storage (on one machine here; with a PostgreSQL URL, from any machine), each running
# two trials. From a script, ``study.optimize(4, n_workers=2)`` starts such processes
# itself (under ``if __name__ == "__main__":``). The claims need no lock: no
# architecture is trained twice.
import subprocess
import sys
import tempfile
from pathlib import Path

import autosearch
from controllers import RandomSearch
from search_spaces import ResNetSpace

folder = Path(tempfile.mkdtemp())
storage = f"sqlite:///{folder}/study.db"
space = ResNetSpace(min_stages=2, max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8,))
study = autosearch.create_study(
    "workers",
    controller=RandomSearch(space, seed=0),
    data="digits",
    train=autosearch.TrainConfig(epochs=2, batch_size=64, lr=0.1),
    storage=storage,
)
worker = [
    sys.executable,
    "-m",
    "autosearch.cli",
    "worker",
    "--study",
    "workers",
    "--storage",
    storage,
]
workers = [subprocess.Popen([*worker, "--n-trials", "2"], cwd=folder) for _ in range(2)]
print("exit statuses:", [w.wait() for w in workers])
for r in study.records():
    print(r.trial, r.state, r.description, f"{r.metrics['accuracy']:.3f}")

# %%
# A failing candidate is recorded, with its reason
# ------------------------------------------------
# A learning rate far too high makes the loss NaN: the trial fails with where and why,
# and the study goes on (after 10 failures in a row it stops and says so).
broken = autosearch.create_study(
    "failing",
    controller=RandomSearch(space, seed=1),
    data="digits",
    train=autosearch.TrainConfig(epochs=1, batch_size=64, lr=1e6),
    storage=f"sqlite:///{folder}/study.db",
)
records = broken.optimize(1, show_progress_bar=False)
failed = broken.records()[0]
print(failed.state, "-", failed.reason)

# %%
# Continue, and rerun a trial
# ---------------------------
# Opening the study again continues it: trials done are not retrained, the controller's
# state is restored. ``rerun`` retrains one trial from scratch with its stored seed and
# reports whether it matched (on a CPU it does exactly).
again = autosearch.load_study("workers", storage=f"sqlite:///{folder}/study.db")
print(len(again.records()), "trials stored")
check = again.rerun(again.records()[0].trial)
print("stored:", check["stored"], "rerun:", check["rerun"], "identical:", check["identical"])
