"""What keeps the suite hermetic: its own home, temp and cache folders, none of the
user's settings, and no process left behind by a test, whatever became of it.

- :func:`isolate` (at the start of every test process): ``HOME``, the XDG folders and
  ``TMPDIR`` point into a folder of the run's own, and the environment variables that
  autosearch or the services the tests start would read from a user's shell are
  cleared (``USER_SETTINGS``, ``USER_NAMES``): a ``~/.ray/auth_token``, ``~/.aws/config``,
  ``RAY_ADDRESS``, ``AUTOSEARCH_HEARTBEAT_GRACE``, an ``https_proxy``, ``TQDM_DISABLE``
  or ``GLOO_SOCKET_IFNAME`` of the user's changes nothing here.
- :func:`environment_kept` (around each test file): what a library set in the test
  process's environment while the file ran (Ray's driver: ``RAY_AUTH_MODE``,
  ``PYTHONBREAKPOINT``) is gone before the next file starts its processes.
- Every process a test starts carries ``AUTOSEARCH_TEST_TAG`` in its environment (set
  per test, inherited by whatever it starts: torchrun's ranks, Ray's daemons and
  workers, ``autosearch worker`` processes). When the test ends, processes still
  carrying its tag are stopped (:func:`stop_tagged`): a failed or timed-out test leaves
  no gcs_server, raylet or rank behind. A fixture that outlives one test (a Ray cluster
  for a module) tags its processes with a tag of its own and stops them itself.

Linux only (``/proc``); elsewhere nothing is stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

TAG = "AUTOSEARCH_TEST_TAG"

# Settings a user's shell may hold that autosearch, or what the tests start, reads.
USER_SETTINGS = (
    "AUTOSEARCH_",  # autosearch's own (heartbeat, cache, data memory, loader workers, ...)
    "RAY_",  # RAY_ADDRESS, RAY_AUTH_MODE, RAY_AUTH_TOKEN(_PATH), RAY_TMPDIR, ...
    "AWS_",  # boto3: profile, endpoint, config and credentials files
    "BOTO_",
    "PG",  # libpq / psycopg: PGHOST, PGPASSWORD, PGSSLMODE, PGSERVICEFILE, ...
    "OPTUNA_",
    "MLFLOW_",
    "CUDA_MPS_",  # an MPS daemon of the user's
    "TORCH",  # TORCH_LOGS, TORCH_HOME, TORCHDYNAMO_DISABLE, TORCHINDUCTOR_*, TORCHELASTIC_*
    "PYTORCH_",  # PYTORCH_JIT, PYTORCH_CUDA_ALLOC_CONF, ...
    "GLOO_",  # GLOO_SOCKET_IFNAME: the interface torchrun's gloo ranks talk over
    "NCCL_",
    "OMP_",  # thread counts torch reads at import (the suite sets its own)
    "MKL_",
    "KMP_",
    "SLURM_",  # inside a Slurm allocation, submitit takes its job for the tests'
    "SUBMITIT_",
    "TQDM_",  # tqdm reads TQDM_DISABLE, TQDM_MININTERVAL, ... as every bar's defaults
    "HYPOTHESIS_",  # its storage folder (the suite's profile: conftest)
)
# Single names: a proxy (the tests talk to servers on 127.0.0.1 only: boto3, requests,
# gRPC and urllib would send that through a user's proxy), Python's warning filters in
# the processes the tests start (they read those processes' output), Hypothesis's
# switch to its CI profile.
USER_NAMES = (
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "grpc_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "PYTHONWARNINGS",
    "CI",
)
TORCHRUN = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)
ROOT = "AUTOSEARCH_TEST_ROOT"  # the run's folder, for the test processes it starts
# CI's switches and the run's own folder, not a user's settings.
KEPT = ("AUTOSEARCH_REQUIRE_BROWSER", "AUTOSEARCH_REQUIRE_DOCS", ROOT)


def isolate_process() -> tuple[Path, bool]:
    """This test process's folder, isolated (:func:`isolate`), and whether it made it
    (and removes it at the end). The first process of a run (pytest, or xdist's
    controller) makes one in the system's temp folder; xdist's workers each take a
    sub-folder of it (short paths: a browser's socket path has a length limit; and
    removed by the controller after the workers, and their multiprocessing
    finalizers, have ended)."""
    worker, shared = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get(ROOT)
    if worker and shared and Path(shared).is_dir():
        root, owned = Path(shared) / worker, False
    else:
        root, owned = Path(tempfile.mkdtemp(prefix="autosearch-tests-")), True
        os.environ[ROOT] = str(root)
    isolate(root)
    return root, owned


def isolate(root: Path) -> dict[str, str]:
    """Point home, temp and cache folders into ``root`` and clear the user's settings;
    what was cleared (name: value), for the record."""
    cleared = {}
    for name in list(os.environ):
        if name in KEPT:
            continue
        if name.startswith(USER_SETTINGS) or name in USER_NAMES or name in TORCHRUN:
            cleared[name] = os.environ.pop(name)
    folders = {
        "HOME": root / "home",
        "XDG_CONFIG_HOME": root / "home" / ".config",
        "XDG_CACHE_HOME": root / "home" / ".cache",
        "XDG_DATA_HOME": root / "home" / ".local" / "share",
        "TMPDIR": root / "tmp",
    }
    for name, folder in folders.items():
        folder.mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(folder)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    # Latency samples of 5 ms instead of 50: the tests check that latency is measured
    # and stored, never its precision (a tenth of each measurement's time, in every
    # process the tests start).
    os.environ["AUTOSEARCH_LATENCY_SAMPLE_SECONDS"] = "0.005"
    return cleared


@contextlib.contextmanager
def environment_kept() -> Iterator[None]:
    """This process's environment, whatever is set or removed inside, as it was before."""
    before = dict(os.environ)
    try:
        yield
    finally:
        if os.environ != before:
            os.environ.clear()
            os.environ.update(before)


def new_tag() -> str:
    return uuid.uuid4().hex


def tagged(tag: str) -> list[int]:
    """Processes (other than this one) whose environment carries ``TAG=tag``."""
    needle = f"{TAG}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc/self/environ").exists() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


# Helpers a test process keeps for its whole life (started by whichever test first
# needed them): multiprocessing's fork server and resource tracker, torch.compile's
# worker pool. Not leftovers of a test.
_PROCESS_HELPERS = (
    b"multiprocessing.forkserver",
    b"multiprocessing.resource_tracker",
    b"torch._inductor.compile_worker",
)


def _describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").strip()
    except OSError:
        return f"{pid}"
    return f"{pid} {cmd.decode(errors='replace')[:120]}"


def _is_helper(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return any(h in cmd for h in _PROCESS_HELPERS) and _parent(pid) == os.getpid()


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return int(stat[1])
    except (OSError, ValueError, IndexError):
        return -1


def using(folder: str) -> list[int]:
    """Processes (other than this one) with a file open inside ``folder``: Ray's agents
    retitle themselves (``ray::DashboardAgent``), which overwrites the environment that
    carried the tag, but keep their logs open in the session folder."""
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc/self/fd").exists() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            links = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        if any(link.startswith(f"{folder.rstrip('/')}/") for link in links):
            found.append(int(entry.name))
    return found


def stop_tagged(
    tag: str, *, helpers: bool = False, grace: float = 5.0, folder: str | None = None
) -> list[str]:
    """Stop every process carrying ``tag`` (SIGTERM, then SIGKILL after ``grace``
    seconds), and every one using ``folder``; what was stopped. ``helpers``: this
    process's own helpers too."""
    pids = [p for p in tagged(tag) if helpers or not _is_helper(p)]
    pids += [p for p in using(folder) if p not in pids] if folder else []
    stopped = [_describe(p) for p in pids]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL if _ignores_sigterm(pid) else sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            time.sleep(0.05)
        if not pids:
            break
    return stopped


# Ray's own processes: its GCS server and autoscaler monitor never end on SIGTERM (a
# raylet takes seconds), so `ray stop` kills them after a grace; nothing of theirs
# outlives a test (its state is in the test's temp folder), so they are killed at once.
_RAY_PROCESSES = (b"/site-packages/ray/", b"ray::")


def _ignores_sigterm(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return any(marker in cmd for marker in _RAY_PROCESSES)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    if state == "Z":  # a zombie child of ours: reap it
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True
