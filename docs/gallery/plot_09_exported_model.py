"""
The exported model
==================

``study.export(record, DIR)`` (or ``autosearch export``) writes a folder that needs
nothing of autosearch: the network's source (``model.py``, importing only torch), its
weights (safetensors), an ONNX file checked against torch at export, and the metrics.
This tutorial exports a trained candidate and uses it as a user would.
"""

# %%
# A trained candidate, exported
# -----------------------------
import importlib.util
import json
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime
import torch
from sklearn.datasets import load_digits

import autosearch
from controllers import RandomSearch
from search_spaces import ResNetSpace

folder = Path(tempfile.mkdtemp())
study = autosearch.create_study(
    "export",
    controller=RandomSearch(
        ResNetSpace(min_stages=2, max_stages=2, depths=(1,), widths=(16,), stem_widths=(8,)), seed=0
    ),
    data="digits",
    train=autosearch.TrainConfig(epochs=4, batch_size=64, lr=0.1),
    storage=f"sqlite:///{folder}/study.db",
)
records = study.optimize(1, show_progress_bar=False)
out = study.export(study.best(), folder / "model")
for path in sorted(out.iterdir()):
    print(f"{path.stat().st_size:>9} {path.name}")

# %%
# ``arch.json`` says what it is and what was measured
# ----------------------------------------------------
arch = json.loads((out / "arch.json").read_text())
print({k: arch[k] for k in arch if k in ("space", "description", "metrics")})

# %%
# Loaded with torch alone
# -----------------------
# ``model.load()`` returns the network in eval mode; ``model.preprocess`` turns uint8
# images into its normalised input.
spec = importlib.util.spec_from_file_location("model", out / "model.py")
model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model)
net = model.load()
digits = load_digits()
images = torch.from_numpy((digits.images[:8] * 255 / 16).astype(np.uint8)).unsqueeze(1)
logits = net(model.preprocess(images))
print("predicted:", logits.argmax(1).tolist())
print("labels:   ", digits.target[:8].tolist())

# %%
# The same network in ONNX Runtime
# --------------------------------
session = onnxruntime.InferenceSession(str(out / "model.onnx"))
onnx_logits = session.run(None, {"images": model.preprocess(images).numpy()})[0]
print("largest difference from torch:", float(np.abs(onnx_logits - logits.detach().numpy()).max()))
