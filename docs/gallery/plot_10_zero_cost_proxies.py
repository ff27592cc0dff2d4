"""
Zero-cost proxies: an estimate before any training
==================================================

A zero-cost proxy scores an untrained network from one mini-batch of training images:
AZ-NAS's expressivity, progressivity, trainability and complexity, MeCo, synflow,
NASWOT, jacob_cov, snip and grad_norm, each written from its paper's definition
(``autosearch.evaluation.proxies``), most of them from one shared forward and backward
pass. The default estimate combines six of them by AZ-NAS's log-rank aggregation. A
study asked for them scores every candidate at the initialization it trains from,
stores the scores with the trial, and its report ranks each proxy against the accuracy
the candidates reached. Below: a small study on digits, then the proxies of
NAS-Bench-201 cells at the benchmark's real size against the published CIFAR-10
accuracies (``benchmarks/nb201_proxies.py``; its stored figures are drawn here, so the
page shows what was measured).
"""

# %%
# A study that scores its candidates
# ----------------------------------
# ``proxies=ProxyConfig(...)``: which proxies (by default the estimate's six) and how
# many images (one batch, drawn with the study's seed, the same for every candidate).
# Training is unchanged by them.
import json
import tempfile
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from scipy import stats

import autosearch
from controllers import RandomSearch
from search_spaces import ResNetSpace

folder = Path(tempfile.mkdtemp())
space = ResNetSpace(max_stages=2, depths=(1, 2), widths=(4, 8, 16), stem_widths=(8, 16))
study = autosearch.create_study(
    "proxies",
    controller=RandomSearch(space, seed=0),
    data="digits",
    train=autosearch.TrainConfig(epochs=2, batch_size=64, lr=0.1),
    proxies=autosearch.ProxyConfig(batch=32),
    storage=f"sqlite:///{folder}/study.db",
)
records = study.optimize(6, show_progress_bar=False)
for r in records:
    print(
        f"trial {r.trial}: val acc {r.metrics['accuracy']:.3f}, "
        f"expressivity {r.metrics['expressivity']:.2f}, meco {r.metrics['meco']:.2f}, "
        f"synflow {r.metrics['synflow']:.3g}, {r.metrics['proxy_seconds']:.2f} s of proxies"
    )

# %%
# How each proxy, and the estimate (their log ranks summed), ranked this study's
# candidates (the report shows the same table).
from autosearch.scoring.ranks import combined

accuracy = [r.metrics["accuracy"] for r in records]
names = study.definition.proxies.names
estimate = combined({n: [r.metrics[n] for r in records] for n in names})
rho = stats.spearmanr(estimate, accuracy)[0]
print(f"  estimate: Spearman {rho:+.2f} over {len(records)} candidates")
for name in (*names, "flops"):
    rho = stats.spearmanr([r.metrics[name] for r in records], accuracy)[0]
    print(f"{name:>10}: Spearman {rho:+.2f} over {len(records)} candidates")

# %%
# NAS-Bench-201 at its real size
# ------------------------------
# Cells drawn uniformly (1,000 a seed), each network at NAS-Bench-201's own size (16
# channels, 5 cells a stage, 32 x 32 CIFAR-10 images) scored by every proxy on one batch
# of 64 CIFAR-10 training images, against the accuracy NAS-Bench-201 publishes for it.
# Higher is better for every proxy; a proxy that ranks well rises from left to right.
repository = Path(autosearch.__file__).resolve().parents[1]
nb201 = repository / "benchmarks" / "nb201"
stored = json.loads((nb201 / "proxies-1000-cells-3-seeds.json").read_text())
first = stored["seeds"][0]
names = first["scored_columns"][2:]
published = [row[1] for row in first["scored"]]
columns = {name: [row[2 + i] for row in first["scored"]] for i, name in enumerate(names)}
columns["estimate"] = list(combined({n: columns[n] for n in stored["default"]["proxies"]}))
figure = make_subplots(rows=2, cols=6, subplot_titles=list(columns), shared_yaxes=True)
for i, (name, scores) in enumerate(columns.items()):
    figure.add_trace(
        go.Scatter(x=scores, y=published, mode="markers", marker={"size": 3}, name=name),
        row=1 + i // 6,
        col=1 + i % 6,
    )
figure.update_xaxes(type="log", row=1, col=1)  # synflow spans decades
figure.update_layout(height=560, showlegend=False, yaxis_title="published CIFAR-10 accuracy (%)")
figure

# %%
# What each estimator reached on each seed: Kendall's tau over the cells, within the
# better half, the top-10 precision, and the published accuracy of its best-ranked cell.
for run in stored["seeds"]:
    print(f"seed {run['seed']} ({run['cells']} cells, best {run['best_of_the_cells_published']}):")
    for name, f in run["estimators"].items():
        print(
            f"  {name:>44.44}: tau {f['kendall_tau']:+.3f}, better half "
            f"{f['kendall_tau_better_half']:+.3f}, top-10 {f['precision_top10']:.1f}, "
            f"pick {f['best_ranked_published']:.2f}"
        )

# %%
# A few trainings, spent where the ranker is least sure
# -----------------------------------------------------
# The ranker (``autosearch.evaluation.ranker``) fitted on ``k`` trained cells
# (``benchmarks/nb201_ranker.py``; a training is the published accuracy): the estimate's
# top ``k`` trained, ``k`` drawn at random, or chosen a quarter at a time where its
# members disagree among the ranked top. The pick is the best trained cell or the
# ranker's top: what a study ends with.
ranked = json.loads((nb201 / "ranker-1000-cells-3-seeds.json").read_text())
for run in ranked["seeds"]:
    print(f"seed {run['seed']} (best of its cells {run['best_of_the_cells_published']}):")
    for name, f in run["figures"].items():
        print(
            f"  {name:>10}: tau {f['kendall_tau']:+.3f}, better half "
            f"{f['kendall_tau_better_half']:+.3f}, pick {f['pick_published']:.2f}"
        )

# %%
# The same estimators on a space of depths and widths
# ---------------------------------------------------
# The ResNet sub-space of the weight-sharing benchmark: 30 subnets that differ only in
# depth and width, each trained four times on Fashion-MNIST (the ground truth), scored
# by every proxy as a study scores it, by FLOPs, parameters and the stored supernet
# (``benchmarks/resnet_proxies.py``; its stored figures are drawn here). Kendall's tau
# against the mean of the three trainings the ranker did not learn from, one bar a
# seed; the dashed line is how well one training ranks them (the truth is that noisy).
resnet = json.loads(
    (repository / "benchmarks" / "ground_truth" / "resnet-proxies-3-seeds.json").read_text()
)
estimators = list(resnet["seeds"][0]["against_seeds_1_3"])
figure = go.Figure(
    [
        go.Bar(
            name=f"seed {run['seed']}",
            x=estimators,
            y=[run["against_seeds_1_3"][e]["kendall_tau"] for e in estimators],
        )
        for run in resnet["seeds"]
    ]
)
figure.add_hline(
    y=resnet["seeds_agree"]["seed0_vs_later"], line_dash="dash", annotation_text="one training"
)
figure.update_layout(height=380, barmode="group", yaxis_title="Kendall tau")
figure

# %%
# Starting a search from the proxies' best
# ----------------------------------------
# ``ZeroCostWarmup`` wraps a controller: the study scores a pool of untrained
# candidates with its own proxies (each exactly as its trial will store them), trains
# the ``first`` best by the estimate (their log ranks summed), then lets the wrapped controller
# search from there. The scores are kept in the study's storage, shared by its workers.
from controllers import ZeroCostWarmup

warm = autosearch.create_study(
    "warm",
    controller=ZeroCostWarmup(
        space, controller={"name": "evolution", "config": {"seed": 0}}, pool=24, first=3
    ),
    data="digits",
    train=autosearch.TrainConfig(epochs=2, batch_size=64, lr=0.1),
    proxies=autosearch.ProxyConfig(batch=32),
    storage=f"sqlite:///{folder}/warm.db",
)
for r in warm.optimize(5, show_progress_bar=False):
    print(
        f"trial {r.trial}: {space.describe(r.arch)}, val acc {r.metrics['accuracy']:.3f}, "
        f"expressivity {r.metrics['expressivity']:.2f}, meco {r.metrics['meco']:.2f}"
    )
