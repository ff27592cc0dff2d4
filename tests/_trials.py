"""Helpers for the tests that kill workers and read what the storage holds after."""

from __future__ import annotations


def the_resume(trials, cut):
    """The trial that resumed ``cut``: two workers may both claim its resume at once
    (more likely on a loaded machine), and the later one gives its trial up as a
    duplicate; exactly one resume holds it."""
    resumes = [t for t in trials if t.user_attrs.get("resumes") == cut.number]
    held = [t for t in resumes if "superseded" not in t.user_attrs]
    assert len(held) == 1, [(t.number, t.state.name, dict(t.user_attrs)) for t in resumes]
    assert all("duplicate" in t.user_attrs["superseded"] for t in resumes if t not in held)
    return held[0]


def sigterm_after_first_epoch(command, cwd, study: str, url: str, env=None):
    """Run ``command`` (an `autosearch run`), send it SIGTERM once its first trial's first
    epoch is stored (waiting on the storage, not a clock; the bound keeps a hang out),
    and give its exit status and its output (stdout and stderr)."""
    import signal
    import subprocess
    import time

    import autosearch

    def one_epoch_in() -> bool:
        try:
            trials = autosearch.load_study(study, storage=url, read_only=True).trials.all()
        except autosearch.AutosearchError:
            return False  # not created yet
        return bool(trials) and len(trials[0].intermediate_values) >= 1

    run = subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        for _ in range(18000):
            if one_epoch_in():
                break
            time.sleep(0.1)
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=1800)
    finally:
        run.kill()
    return run.returncode, out
