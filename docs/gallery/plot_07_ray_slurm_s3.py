"""
Ray, Slurm and S3, on one machine
=================================

On a cluster, the same study runs its workers through the engine you already use, and
keeps its weights and checkpoints in a bucket every node reaches. This tutorial runs the
whole arrangement on one machine with the services the repository's tests start: an S3
server (moto's) on 127.0.0.1, a Slurm job array through submitit's local executor (the
same jobs ``sbatch`` would run), and a local Ray cluster. On a real cluster only the
addresses change: a PostgreSQL storage every node reaches, the bucket's endpoint and
credentials, ``RayExecutor(address=...)``, and ``SlurmExecutor(slurm_partition=...)``.
"""

# %%
# A bucket
# --------
# Endpoint and credentials come from the usual ``AWS_*`` variables.
import os
import socket
import tempfile
from pathlib import Path

import boto3
from moto.server import ThreadedMotoServer

import autosearch
from autosearch import RayExecutor, SlurmExecutor
from controllers import RandomSearch
from search_spaces import ResNetSpace

with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
server.start()
aws = {
    "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
os.environ.update(aws)
bucket = boto3.client("s3").create_bucket(Bucket="studies")

# %%
# A study whose weights live in the bucket
# ----------------------------------------
folder = Path(tempfile.mkdtemp())
study = autosearch.create_study(
    "cluster",
    controller=RandomSearch(
        ResNetSpace(min_stages=2, max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8,)),
        seed=0,
    ),
    data="digits",
    train=autosearch.TrainConfig(epochs=2, batch_size=64, lr=0.1),
    storage=f"sqlite:///{folder}/study.db",  # on a cluster: postgresql://user@db-host/autosearch
    artifacts="s3://studies/cluster",
)

# %%
# Slurm: the workers as one job array
# -----------------------------------
# ``cluster="local"`` runs the array's jobs as processes here; without it, on a login
# node, they are submitted with ``sbatch`` (partition, time limit, CPUs and GPUs per task
# as given).
jobs = SlurmExecutor(folder=str(folder / "slurm"), cluster="local", timeout_min=10)
records = study.optimize(2, n_workers=2, executor=jobs)
print([(r.trial, r.state) for r in records])

# %%
# Ray: the workers as tasks
# -------------------------
# A Ray cluster of one node, started as on a cluster's head node (``ray start --head``;
# other nodes would join it with ``ray start --address``). Each worker is a Ray task
# with ``num_cpus`` / ``num_gpus`` (fractional GPUs put several small candidates on one
# GPU); a worker lost with its node is run again by Ray, and its trial resumes from the
# checkpoint in the bucket. The tasks get the bucket's credentials through ``env_vars``.
import subprocess
import sys

ray_cli = str(Path(sys.executable).with_name("ray"))
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    head = probe.getsockname()[1]
local = ["--node-ip-address", "127.0.0.1", "--num-cpus", "2", "--disable-usage-stats"]
subprocess.run(
    [ray_cli, "start", "--head", "--port", str(head), "--include-dashboard", "false", *local],
    check=True,
    capture_output=True,
)
executor = RayExecutor(
    address=f"127.0.0.1:{head}", num_cpus=1, env_vars=aws, init={"_node_ip_address": "127.0.0.1"}
)
records = study.optimize(2, n_workers=2, executor=executor)
print([(r.trial, r.state) for r in records])
import ray

ray.shutdown()
subprocess.run([ray_cli, "stop", "--force"], check=True, capture_output=True)

# %%
# What the bucket holds
# ---------------------
# Every trial's weights (content-addressed), and each attempt's checkpoints while it
# trains (deleted once the trial is complete).
listing = boto3.client("s3").list_objects_v2(Bucket="studies", Prefix="cluster/")
for item in listing.get("Contents", [])[:8]:
    print(f"{item['Size']:>9} {item['Key']}")
print(len(study.records()), "trials complete;", listing.get("KeyCount"), "objects")
server.stop()
