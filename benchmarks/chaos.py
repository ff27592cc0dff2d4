"""Chaos soak: workers of three studies (a trained one, a supernet one, one whose
candidates train in shards) and a population on one storage while a chaos loop kills,
stops, terminates and starves them, and damages their files, then invariant checkers.

Each round makes the studies afresh and keeps their worker slots busy: per study an
``autosearch run FILE`` (one worker, or a local pool of two with ``--workers 2``) and an
``autosearch worker --total T`` process, each started again when it ends until its
study holds its trials; once the trained study is done, ``autosearch population`` trains
its best as a population. Meanwhile the chaos loop, at random moments, sends SIGKILL,
SIGSTOP (SIGCONT some seconds later, sometimes past the heartbeat grace) and SIGTERM,
mostly to processes that hold a trial or a job claim; removes or cuts short checkpoint
files (a trial's, a shard of a sharded trial's, a population member's); and on
PostgreSQL cuts the workers' connections (``pg_terminate_backend``), also under a worker
paused inside its end-of-trial transaction, whose commit then lands on a cut connection.
Failpoints (autosearch/workers/_failpoints.py) aim kills where a random signal
seldom lands: inside the transaction that ends a trial, just after it, with the weights
uploaded, before the controller is told, after an epoch's checkpoint. When every study
holds its trials, one last ``autosearch run`` each (no chaos) must finish, and the
invariants are checked (benchmarks/_chaos_checks.py). Prints JSON:

    python benchmarks/chaos.py --backend sqlite journal postgresql --minutes 30
    python benchmarks/chaos.py --quick          # seconds of chaos, tiny data (the suite's)

Nothing but 127.0.0.1 is reached; PostgreSQL is the local server (a database per round).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from _chaos_checks import check, studies  # noqa: E402

TRAINED = """
from autosearch import StudySpec, TrainConfig
from controllers import RegularizedEvolution
from search_spaces import ResNetSpace

space = ResNetSpace(
    min_stages=2, max_stages=2, depths=(1, 2), widths=(4, 8), stem_widths=(4, 8),
    blocks=("basic",),
)
study = StudySpec(
    name="trained",
    controller=RegularizedEvolution(space, population=6, sample=3, seed=0),
    train=TrainConfig(epochs={epochs}, batch_size=32, lr=0.1),
    storage={storage!r},
    artifacts={artifacts!r},
    n_trials={n_trials},
)
"""

SUPERNET = """
from autosearch import StudySpec, SupernetConfig, TrainConfig
from controllers import RandomSearch
from search_spaces import ResNetSpace

space = ResNetSpace(max_stages=2, depths=(1, 2), widths=(4, 8), stem_widths=(4, 8)).supernet(
    fixed={{"stages": 2, "block": "basic", "shortcut": "pad"}}
)
study = StudySpec(
    name="supernet",
    controller=RandomSearch(space, seed=0),
    train=TrainConfig(epochs=1, batch_size=64, lr=0.1),
    supernet=SupernetConfig(train=TrainConfig(epochs={epochs}, batch_size=64, lr=0.1)),
    variants=("base", "int8"),
    storage={storage!r},
    artifacts={artifacts!r},
    n_trials={n_trials},
)
"""

SHARDED = """
from autosearch import StudySpec, TrainConfig
from controllers import RandomSearch
from search_spaces import ResNetSpace

space = ResNetSpace(
    min_stages=2, max_stages=2, depths=(1, 2), widths=(4, 8), stem_widths=(4, 8),
    blocks=("basic",),
)
study = StudySpec(
    name="sharded",
    controller=RandomSearch(space, seed=1),
    train=TrainConfig(epochs={epochs}, batch_size=32, lr=0.1, parallel="fsdp"),
    storage={storage!r},
    artifacts={artifacts!r},
    n_trials={n_trials},
)
"""

# Where failpoints act, and how often a worker passing there dies (or, on PostgreSQL,
# pauses inside its end-of-trial transaction: its connection is cut before it resumes).
FAILPOINTS = (
    "end_trial.before=kill@0.01,end_trial.inside=kill@0.03,end_trial.after=kill@0.02,"
    "store.weights=kill@0.04,tell.before=kill@0.03,epoch.saved=stop@0.01"
)
PAUSED_COMMITS = FAILPOINTS.replace("end_trial.inside=kill@0.03", "end_trial.inside=stop@0.03")
GRACE = 8.0  # the workers' heartbeat grace: a stop can outlast it
# What the connection of a worker whose commit was refused on a cut connection says.
CUT_COMMIT = "the connection to the database was lost"


class Round:
    """One round of chaos on ``backend``: two fresh studies and their worker slots."""

    def __init__(self, backend: str, folder: Path, rng: random.Random, settings: dict) -> None:
        self.backend, self.folder, self.rng, self.settings = backend, folder, rng, settings
        self.url = _storage_url(backend, folder, rng)
        self.files = {}
        templates = {"trained": TRAINED, "supernet": SUPERNET, "sharded": SHARDED}
        for name, template in ((n, templates[n]) for n in studies(settings)):
            path = folder / f"{name}.py"
            path.write_text(
                template.format(
                    storage=self.url,
                    artifacts=str(folder / "artifacts" / name),
                    **settings[name],
                )
            )
            self.files[name] = path
        self.slots = [
            {"study": "trained", "kind": "pool"},
            {"study": "trained", "kind": "worker"},
            {"study": "supernet", "kind": "run"},
            {"study": "supernet", "kind": "worker"},
            {"study": "sharded", "kind": "run"},
        ]
        if "population" in settings:  # started once the trained study is done
            self.slots.append({"study": "population", "kind": "population"})
        self.counts: Counter = Counter()
        self.stopped: dict[int, float] = {}  # pid -> when to SIGCONT
        self.paused_by_failpoint: set[int] = set()
        self.exits: Counter = Counter()
        self.logs: list[Path] = []
        self.calm = False  # no more chaos: no signals, workers started without failpoints

    # Workers ---------------------------------------------------------------------------
    def env(self, *, chaos: bool) -> dict[str, str]:
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "AUTOSEARCH_HEARTBEAT_INTERVAL": "1",
            "AUTOSEARCH_HEARTBEAT_GRACE": str(GRACE),
            "AUTOSEARCH_CACHE": str(self.folder / "cache"),
            "PYTHONUNBUFFERED": "1",
        }
        if chaos:
            paused = self.backend == "postgresql"
            env["AUTOSEARCH_FAILPOINTS"] = PAUSED_COMMITS if paused else FAILPOINTS
        return env

    def command(self, slot: dict) -> list[str]:
        cli = str(Path(sys.executable).with_name("autosearch"))
        if slot["kind"] == "population":
            size, interval = (self.settings["population"][k] for k in ("size", "interval"))
            return [cli, "population", str(self.files["trained"]), "--size", str(size),
                    "--interval", str(interval)]  # fmt: skip
        study, total = slot["study"], self.settings[slot["study"]]["n_trials"]
        file = str(self.files[study])
        if slot["kind"] == "worker":
            return [cli, "worker", "--study", study, "--storage", self.url, "--n-trials", "3",
                    "--total", str(total)]  # fmt: skip
        pool = ["--workers", "2"] if slot["kind"] == "pool" else []
        return [cli, "run", file, "--out", str(self.folder / "out" / study), *pool]

    def start(self, slot: dict) -> None:
        log = self.folder / "logs" / f"{slot['study']}-{slot['kind']}-{len(self.logs)}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.logs.append(log)
        with log.open("w") as out:
            slot["process"] = subprocess.Popen(
                self.command(slot),
                env=self.env(chaos=not self.calm),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.folder,
                start_new_session=True,  # a kill of the harness's group spares them
            )
        self.counts["workers started"] += 1

    def reap(self, done: dict[str, bool]) -> None:
        """Start again each slot whose process ended while its study is not done."""
        for slot in self.slots:
            process = slot.get("process")
            if process is not None and process.poll() is None:
                continue
            if process is not None:
                self.exits[_exit_name(process.returncode)] += 1
                slot["process"] = None
            if slot["kind"] == "population" and not done["trained"]:
                continue  # its architecture is the trained study's best
            if not done[slot["study"]]:
                self.start(slot)

    def processes(self) -> list[int]:
        """The pids of every slot's process and of its children (a pool's workers), but
        Python's own helpers (multiprocessing's resource tracker): killing one only
        makes Python warn about semaphores it can no longer track."""
        roots = [s["process"].pid for s in self.slots if s.get("process") is not None]
        return [p for p in _descendants(roots) if b"resource_tracker" not in _cmdline(p)]

    # Chaos -----------------------------------------------------------------------------
    def act(self, reader) -> None:
        self.resume_stopped()
        actions = self.settings["actions"]
        action = self.rng.choices(list(actions), weights=list(actions.values()))[0]
        if action == "connections" and self.backend != "postgresql":
            action = "kill"
        if action == "checkpoint":
            return self.remove_checkpoint()
        if action == "connections":
            return self.cut_connections()
        pids = [p for p in self.processes() if p not in self.stopped]
        if not pids:
            return None
        phases = reader.phases()
        busy = [p for p in pids if p in phases]
        # Where work is under way: a trial or a job claim held. Now and then anywhere
        # (starting, claiming, a pool's parent); when no claim is held, mostly not now.
        anywhere = self.rng.random() < self.settings["anywhere"]
        if not busy and not anywhere:
            self.counts["signal held back: no claim held"] += 1
            return None
        pid = self.rng.choice(pids if anywhere or not busy else busy)
        phase = phases.get(pid, "no trial held (starting, claiming, a pool's parent)")
        sig = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "term": signal.SIGTERM}[action]
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return None
        self.counts[f"{action}: {phase}"] += 1
        if action == "stop":
            self.stopped[pid] = time.monotonic() + self.rng.uniform(1.0, 2.0 * GRACE)
        return None

    def resume_stopped(self) -> None:
        """SIGCONT what the loop stopped once its time is up, and what a failpoint
        stopped (found in state T) after a while; on PostgreSQL, a worker a failpoint
        paused inside its end-of-trial transaction resumes on a cut connection."""
        now = time.monotonic()
        for pid in self.processes():
            if pid not in self.stopped and _state(pid) == "T":
                self.stopped[pid] = now + self.rng.uniform(1.0, 2.0 * GRACE)
                self.paused_by_failpoint.add(pid)
        for pid, when in list(self.stopped.items()):
            if now >= when:
                if pid in self.paused_by_failpoint and self.backend == "postgresql":
                    self.cut_connections()
                    self.counts["connections cut under a paused commit"] += 1
                with _suppress():
                    os.kill(pid, signal.SIGCONT)
                del self.stopped[pid]
                self.paused_by_failpoint.discard(pid)

    def remove_checkpoint(self) -> None:
        """Remove a checkpoint's file, or cut it short: a trial's (its training state, a
        variant's result), a shard of a sharded trial's, a population member's."""
        root = self.folder / "artifacts"
        kinds = {
            "trial": [p for p in root.rglob("checkpoints/**/*") if p.suffix in (".pt", ".json")],
            "shard": [p for p in root.rglob("*.shards-*/*") if p.is_file()],
            "member": list(root.rglob("populations/**/members/*/train.pt")),
        }
        kinds = {k: [p for p in v if p.is_file()] for k, v in kinds.items() if v}
        if not kinds:
            return
        # The kind damaged least so far: a short round reaches each kind there is.
        hit = {
            k: self.counts[f"{k} file removed"] + self.counts[f"{k} file cut short"] for k in kinds
        }
        kind = min(sorted(kinds), key=lambda k: (hit[k], self.rng.random()))
        path = self.rng.choice(kinds[kind])
        with _suppress():
            if self.rng.random() < 0.5:
                path.unlink()
                self.counts[f"{kind} file removed"] += 1
            else:
                with path.open("r+b") as file:
                    file.truncate(file.seek(0, 2) // 2)
                self.counts[f"{kind} file cut short"] += 1

    def cut_connections(self) -> None:
        import psycopg

        database = self.url.rsplit("/", 1)[1]
        with psycopg.connect(host="127.0.0.1", user="postgres", dbname="test") as admin:
            cut = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND application_name <> 'chaos-reader'",
                (database,),
            ).fetchone()[0]
        self.counts["connections cut"] += int(cut)

    def stop_all(self) -> None:
        for pid in self.processes():
            with _suppress():
                os.kill(pid, signal.SIGCONT)
        for slot in self.slots:
            if slot.get("process") is not None and slot["process"].poll() is None:
                os.killpg(slot["process"].pid, signal.SIGKILL)
                slot["process"].wait()
                self.counts["kill: chaos ended"] += 1
            slot["process"] = None

    def failpoint_kills(self) -> Counter:
        """Where the failpoints acted, and the commits refused on a cut connection, from
        the workers' logs."""
        found: Counter = Counter()
        for log in self.logs:
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("autosearch failpoint "):
                    found[f"failpoint {line.removeprefix('autosearch failpoint ')}"] += 1
                elif CUT_COMMIT in line:
                    found["a worker stopped: its connection was cut"] += 1
        return found

    def recover(self) -> dict[str, int]:
        """One run of each study file with no chaos: it must finish, exit 0 (without an
        export: the checks export the best themselves, in ``check``)."""
        codes = {}
        runs = {study: ["run", str(file), "--no-export", "--out", str(self.folder / "out" / study)]
                for study, file in self.files.items()}  # fmt: skip
        if "population" in self.settings:  # the population trial, finished or resumed
            size, interval = (self.settings["population"][k] for k in ("size", "interval"))
            runs["population"] = ["population", str(self.files["trained"]), "--size", str(size),
                                  "--interval", str(interval)]  # fmt: skip
        for study, command in runs.items():
            cli = str(Path(sys.executable).with_name("autosearch"))
            done = subprocess.run(
                [cli, *command],
                env=self.env(chaos=False),
                cwd=self.folder,
                capture_output=True,
                text=True,
                timeout=3600,
            )
            (self.folder / "logs" / f"{study}-recover.log").write_text(done.stdout + done.stderr)
            codes[study] = done.returncode
        return codes


def run_round(backend: str, folder: Path, rng: random.Random, settings: dict, limit: float):
    """Chaos until both studies hold their trials (or ``limit`` seconds; at most
    ``chaos_for`` seconds of it), recovery, checks."""
    from _chaos_checks import Reader

    chaos = Round(backend, folder, rng, settings)
    for file in chaos.files.values():
        _create(file)
    reader = Reader(chaos.url, settings)
    start = time.monotonic()
    try:
        while time.monotonic() - start < limit:
            done = reader.done()
            chaos.reap(done)
            if all(done.values()) and not chaos.processes():
                break
            time.sleep(rng.uniform(*settings["pause"]))
            calm_after = settings["chaos_for"]
            chaos.calm = calm_after is not None and time.monotonic() - start > calm_after
            if chaos.calm:
                chaos.resume_stopped()
            else:
                chaos.act(reader)
    finally:
        chaos.stop_all()
    seconds = time.monotonic() - start
    recovered = chaos.recover()
    invariants = check(chaos.url, settings, recovered)
    reader.close()
    return {
        "backend": backend,
        "seconds_of_chaos": round(seconds, 1),
        "finished_under_chaos": seconds < limit,
        "actions": dict(chaos.counts + chaos.failpoint_kills()),
        "worker_exits": dict(chaos.exits),
        "recovery_exit_codes": recovered,
        "invariants": invariants,
        "held": all(v["held"] for v in invariants.values()),
    }


def _create(file: Path) -> None:
    from autosearch.studyfile import load_spec

    spec = load_spec(str(file))
    spec.create(storage=spec.storage, artifacts=spec.artifacts)


def _storage_url(backend: str, folder: Path, rng: random.Random) -> str:
    if backend == "sqlite":
        return f"sqlite:///{folder}/study.db"
    if backend == "journal":
        return f"journal:{folder}/study.log"
    import psycopg

    name = f"chaos_{rng.getrandbits(48):012x}"
    with psycopg.connect(host="127.0.0.1", user="postgres", dbname="test", autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return f"postgresql://postgres@127.0.0.1:5432/{name}"


def _descendants(roots: list[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with _suppress():
                ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        if _state(pid) not in ("", "Z"):
            found.append(pid)
        todo += children.get(pid, [])
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def _exit_name(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        return kind is not None and issubclass(kind, (OSError, ValueError, IndexError))


SETTINGS = {
    "full": {
        "trained": {"epochs": 4, "n_trials": 16},
        "supernet": {"epochs": 3, "n_trials": 24},  # of its 32 architectures
        "sharded": {"epochs": 4, "n_trials": 8},
        "population": {"size": 4, "interval": 1},
        "pause": (1.5, 6.0),
        "actions": {
            "kill": 0.30,
            "stop": 0.15,
            "term": 0.15,
            "checkpoint": 0.20,
            "connections": 0.10,
        },
        "anywhere": 0.25,  # how often a signal may go to a process that holds no claim
        "chaos_for": None,  # seconds of chaos in a round: until its studies are done
        "round_limit": 1500.0,
    },
    "quick": {
        "trained": {"epochs": 2, "n_trials": 3},
        "supernet": {"epochs": 1, "n_trials": 4},
        "sharded": {"epochs": 2, "n_trials": 2},
        "population": {"size": 2, "interval": 1},
        "pause": (0.5, 2.0),
        # Its seconds of chaos go to trials and their files, not to imports.
        "actions": {
            "kill": 0.25,
            "stop": 0.10,
            "term": 0.10,
            "checkpoint": 0.45,
            "connections": 0.10,
        },
        "anywhere": 0.1,
        "chaos_for": 40.0,  # then the workers finish in peace (a slow machine restarts
        "round_limit": 900.0,  # each killed one in seconds of imports)
    },
}


def markdown(report: dict) -> str:
    """The report as a table for RESULTS.md: per backend, what was sent, by phase, and
    what held."""
    backends = [b for b in ("sqlite", "journal", "postgresql") if b in report]
    actions = sorted({a for b in backends for a in report[b]["actions"]})
    lines = ["| | " + " | ".join(backends) + " |", "| --- |" + " --- |" * len(backends)]

    def row(label: str, cells: list) -> None:
        lines.append(f"| {label} | " + " | ".join(str(c) for c in cells) + " |")

    row("rounds", [report[b]["rounds"] for b in backends])
    row("minutes of chaos", [round(report[b]["seconds_of_chaos"] / 60, 1) for b in backends])
    for action in actions:
        row(action, [report[b]["actions"].get(action, 0) for b in backends])
    exits = sorted({e for b in backends for e in report[b]["worker_exits"]})
    for code in exits:
        row(f"workers: {code}", [report[b]["worker_exits"].get(code, 0) for b in backends])
    checks = sum(len(r["invariants"]) for b in backends for r in report[b]["rounds_detail"])
    row("invariant checks, held", [
        f"{sum(v['held'] for r in report[b]['rounds_detail'] for v in r['invariants'].values())}"
        f" of {sum(len(r['invariants']) for r in report[b]['rounds_detail'])}"
        for b in backends
    ])  # fmt: skip
    return "\n".join(lines) + f"\n\n{checks} invariant checks in all."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", nargs="+", default=["sqlite", "journal", "postgresql"])
    parser.add_argument("--minutes", type=float, default=30.0, help="of chaos, per backend")
    parser.add_argument("--quick", action="store_true", help="one tiny round per backend")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--folder", help="keep the rounds here (default: a temp folder)")
    parser.add_argument("--markdown", type=Path, help="print a saved report as a table; run none")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    settings = SETTINGS["quick" if args.quick else "full"]
    rng = random.Random(args.seed)
    root = Path(args.folder or tempfile.mkdtemp(prefix="autosearch-chaos-"))
    report = {"machine": platform.processor() or platform.machine(), "seed": args.seed}
    for backend in args.backend:
        rounds, start = [], time.monotonic()
        while not rounds or (not args.quick and time.monotonic() - start < args.minutes * 60):
            folder = root / backend / f"round-{len(rounds)}"
            folder.mkdir(parents=True)
            rounds.append(run_round(backend, folder, rng, settings, settings["round_limit"]))
            print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
        report[backend] = _summary(rounds)
    report["held"] = all(report[b]["held"] for b in args.backend)
    print(json.dumps(report, indent=2))


def _summary(rounds: list[dict]) -> dict:
    actions: Counter = Counter()
    exits: Counter = Counter()
    for r in rounds:
        actions.update(r["actions"])
        exits.update(r["worker_exits"])
    broken = [
        {"round": i, "invariant": name, **result}
        for i, r in enumerate(rounds)
        for name, result in r["invariants"].items()
        if not result["held"]
    ]
    return {
        "rounds": len(rounds),
        "seconds_of_chaos": round(sum(r["seconds_of_chaos"] for r in rounds), 1),
        "actions": dict(sorted(actions.items())),
        "worker_exits": dict(sorted(exits.items())),
        "held": not broken and all(r["held"] for r in rounds),
        "broken": broken,
        "rounds_detail": rounds,
    }


if __name__ == "__main__":
    main()
