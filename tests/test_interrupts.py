"""Ctrl-C and SIGTERM: the first asks for a stop after the epoch's checkpoint, a second
(Ctrl-C or SIGTERM) stops at once, even when both arrive while the main thread is inside
one long native call (where Python runs its handler once for both)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from _trials import sigterm_after_first_epoch

from autosearch.workers import interrupts as interrupts_module

# The main thread spends seconds inside one native call (a key derivation) while the
# signals arrive; Python's handler runs when it returns. The module is loaded from its
# file alone (it needs the standard library only): the child does not pay torch's import.
_CHILD = """
import hashlib, importlib.util, sys

spec = importlib.util.spec_from_file_location("interrupts", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
Interrupts, StopNow = module.Interrupts, module.StopNow

interrupts = Interrupts()
with interrupts.handled():
    try:
        print("ready", flush=True)
        hashlib.pbkdf2_hmac("sha256", b"x", b"y", 3_000_000)
        print("graceful", interrupts.signal, flush=True)
    except StopNow as exc:
        print("stopped", exc.signal, flush=True)
"""


def _send(signals: list[signal.Signals]) -> str:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, interrupts_module.__file__],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        for sig in signals:  # some land before the native call, some inside it: either way
            child.send_signal(sig)
            time.sleep(0.3)  # as a user presses twice (sent at once, the kernel merges them)
        out, err = child.communicate(timeout=1800)
    finally:
        child.kill()
    assert child.returncode == 0, err[-2000:]
    return out.strip()


@pytest.mark.parametrize(
    ("signals", "said"),
    [
        ([signal.SIGINT], "graceful SIGINT"),
        ([signal.SIGTERM], "graceful SIGTERM"),
        ([signal.SIGINT, signal.SIGINT], "stopped SIGINT"),
        ([signal.SIGINT, signal.SIGTERM], "stopped SIGTERM"),
        ([signal.SIGTERM, signal.SIGTERM], "stopped SIGTERM"),
    ],
)
def test_a_second_signal_stops_at_once_however_close_to_the_first(signals, said):
    assert _send(signals) == said


def test_a_previous_wakeup_descriptor_gets_every_delivery_and_is_restored():
    """An event loop's wakeup descriptor (asyncio sets one) still sees the signals that
    arrived while the block ran, and is its own again afterwards."""
    import os

    from autosearch.workers.interrupts import Interrupts

    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    before = signal.set_wakeup_fd(write)
    try:
        interrupts = Interrupts()
        with interrupts.handled():
            signal.raise_signal(signal.SIGINT)
            assert interrupts.requested and interrupts.signal == "SIGINT"
        assert os.read(read, 16) == bytes([signal.SIGINT])
        assert signal.set_wakeup_fd(write) == write  # restored
    finally:
        signal.set_wakeup_fd(before)
        os.close(read)
        os.close(write)


def test_a_second_signal_that_lands_in_a_finalizer_is_not_lost():
    """Seen in the chaos soak: a second SIGTERM whose handler ran inside SQLAlchemy's
    garbage-collector callback was printed as "Exception ignored" and lost (the worker
    finished its epoch). The stop is asked for again, and raised outside the callback;
    other unraisable exceptions still reach the previous hook; the hook is restored."""
    import gc

    from autosearch.workers.interrupts import Interrupts, StopNow

    class LandsHere:
        """As the handler would raise it, had the signal come while this finalizer ran."""

        def __del__(self):
            raise StopNow("SIGTERM")

    class Other:
        def __del__(self):
            raise ValueError("not a stop")

    seen = []
    before = sys.unraisablehook
    # The garbage of the tests before, collected first: a finalizer of theirs that
    # swallows every exception (a bare `except:`) could take the stop sent again (then
    # the first request still stops the work after its epoch; see interrupts.py).
    gc.collect()
    sys.unraisablehook = lambda unraisable: seen.append(type(unraisable.exc_value).__name__)
    try:
        interrupts = Interrupts()
        with pytest.raises(StopNow) as stopped:
            with interrupts.handled():
                signal.raise_signal(signal.SIGTERM)  # the first: stop after the epoch
                assert interrupts.requested and interrupts.signal == "SIGTERM"
                Other()  # collected at once: the previous hook hears of it
                LandsHere()
                gc.collect()
                for _ in range(1000):  # the signal sent again is handled by now
                    time.sleep(0.01)
        assert stopped.value.signal == "SIGTERM"
        assert seen == ["ValueError"]
        assert sys.unraisablehook is not before  # ours, for this test, restored
    finally:
        sys.unraisablehook = before


_DDP_STUDY = """
from autosearch import StudySpec, TrainConfig
from controllers import RandomSearch
from search_spaces import ResNetSpace

study = StudySpec(
    name="cut",
    controller=RandomSearch(
        ResNetSpace(max_stages=2, depths=(1,), widths=(4, 8), stem_widths=(4,)), seed=0
    ),
    train=TrainConfig(epochs=500, batch_size=128, lr=0.1),  # never ends before the signal
    n_trials=1,
)
"""


@pytest.mark.slow
def test_sigterm_to_a_torchrun_study_stops_every_rank_after_the_epoch(tmp_path):
    """`autosearch run --nproc-per-node 2` signalled as Slurm or a terminal does (the
    launcher passes SIGTERM to every rank): all ranks stop after the same epoch, the
    trial is left to resume, not recorded failed (a rank that died at once used to break
    rank 0's next collective, and the trial was stored as failed: never resumed). The
    resumption itself is the same as one process's (tests/test_cli.py, test_confirm.py)."""
    import os
    from pathlib import Path

    import autosearch
    from autosearch.study.records import RESUME, SUPERSEDED

    (tmp_path / "cut.py").write_text(_DDP_STUDY)
    url = f"sqlite:///{tmp_path}/runs/cut/study.db"
    command = [str(Path(sys.executable).with_name("autosearch")), "run", "cut.py"]
    command += ["--nproc-per-node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    code, out = sigterm_after_first_epoch(command, tmp_path, "cut", url, env)
    assert code == 128 + signal.SIGTERM, out[-3000:]
    assert "interrupted (SIGTERM) after 0 of 1 trials" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]  # no rank broke on a collective
    (trial,) = autosearch.load_study("cut", storage=url, read_only=True).trials.all()
    assert trial.user_attrs.get(RESUME) is True, trial.user_attrs
    assert "interrupted by the user" in trial.user_attrs[SUPERSEDED]
    assert 1 <= len(trial.intermediate_values) < 500
