"""A claim's process, as a watcher on the same machine checks it: a worker known dead
at once when its process is gone, never when it is only slow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from hypothesis import given
from hypothesis import strategies as st
from optuna.trial import TrialState, create_trial

from autosearch.workers._heartbeat import (
    HEARTBEAT,
    PROCESS,
    Watch,
    first_stamp,
    process_gone,
    this_process,
)


def _claim(process: object, stamp: float | None = None) -> object:
    system = {HEARTBEAT: time.time() if stamp is None else stamp, PROCESS: process}
    return create_trial(state=TrialState.RUNNING, system_attrs=system)


def _sleeper() -> subprocess.Popen:
    code = "import sys, time\nfrom autosearch.workers._heartbeat import this_process\n"
    code += "print(this_process(), flush=True)\ntime.sleep(600)\n"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_a_process_is_alive_while_it_runs_and_gone_once_killed_waited_for_or_not():
    child = _sleeper()
    try:
        recorded = child.stdout.readline().strip()
        assert recorded and not process_gone(_claim(recorded))
        child.send_signal(signal.SIGSTOP)  # stopped (or slow) is alive
        assert not process_gone(_claim(recorded))
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 600
        while not process_gone(_claim(recorded)):  # a zombie until waited for: gone
            assert time.monotonic() < deadline, "a killed process never looked gone"
            time.sleep(0.01)
        child.wait()
        assert process_gone(_claim(recorded))
    finally:
        child.kill()
        child.wait()


def test_this_process_is_alive_and_its_pid_with_another_start_is_not_it():
    recorded = this_process()
    assert recorded is not None and first_stamp()[PROCESS] == recorded
    assert not process_gone(_claim(recorded))
    machine, pid, start = recorded.rsplit("/", 2)
    assert int(pid) == os.getpid()
    assert process_gone(_claim(f"{machine}/{pid}/{int(start) + 1}"))  # the pid used again


def test_a_process_of_another_machine_boot_or_container_is_never_called_gone():
    machine, _, start = this_process().rsplit("/", 2)
    boot, _, namespace = machine.partition("/")
    unused = 2**22 + 17  # above Linux's largest pid: no such process here
    another_boot = ("1" if boot.startswith("0") else "0") + boot[1:]  # never this one
    for other in (f"{another_boot}/{namespace}", f"{boot}/pid:[1]"):
        assert not process_gone(_claim(f"{other}/{unused}/{start}"))
    assert process_gone(_claim(f"{machine}/{unused}/{start}"))  # on this machine: gone


@given(st.one_of(st.none(), st.integers(), st.lists(st.text()), st.text(max_size=80)))
def test_a_damaged_record_is_read_as_cannot_tell(recorded):
    if isinstance(recorded, str) and recorded == this_process():
        return
    gone = process_gone(_claim(recorded))
    machine = this_process().rsplit("/", 2)[0]
    assert gone is False or (isinstance(recorded, str) and recorded.startswith(machine + "/"))


def test_the_watch_says_why_a_worker_is_dead():
    watch = Watch()
    alive = _claim(this_process())
    assert watch.dead(alive, grace=60) is None
    assert watch.dead(_claim(this_process(), stamp=time.time() - 90), grace=60) == (
        "no heartbeat for 90 s"
    )
    machine, _, start = this_process().rsplit("/", 2)
    assert watch.dead(_claim(f"{machine}/{2**22 + 17}/{start}"), grace=60) == (
        "its process is gone"
    )
