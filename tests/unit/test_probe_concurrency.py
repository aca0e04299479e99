"""On this machine the base probes (queries that change nothing) run at once; the GPU health probes and the GPU smoke
container after them, one at a time; `probes.json` keeps the probes' order either way."""

from __future__ import annotations

import json

from fleetbench.hosts.probes import LocalRunner, Probe, gather

# Each base probe leaves its mark, then waits (up to 10 s) until all three are there: run one after another, the first
# would wait for marks that only come after it ends, and fail.
MEET = 'touch "$0/$1"; for i in $(seq 100); do [ "$(ls "$0" | wc -l)" -ge 3 ] && exit 0; sleep 0.1; done; exit 1'


def test_base_probes_run_at_once_here_and_the_health_probes_after_them_one_at_a_time(tmp_path):
    marks, out = tmp_path / "marks", tmp_path / "out"
    marks.mkdir()
    base = tuple(Probe(f"base-{i}.txt", ("sh", "-c", MEET, str(marks), f"m{i}")) for i in range(3))
    # the first health probe finds every base mark and, a moment later, no mark of the second one yet
    first = Probe("health-1.txt", ("sh", "-c", f'ls "{marks}" | wc -l; touch "{tmp_path}/h1"; sleep 0.3; '
                                               f'[ ! -e "{tmp_path}/h2" ]'))
    second = Probe("health-2.txt", ("sh", "-c", f'[ -e "{tmp_path}/h1" ] && touch "{tmp_path}/h2"'))
    results = gather(LocalRunner(), out, probes=base, extra=(first, second))
    assert [(r.filename, r.exit_code) for r in results] == [
        ("base-0.txt", 0), ("base-1.txt", 0), ("base-2.txt", 0), ("health-1.txt", 0), ("health-2.txt", 0)]
    assert (out / "health-1.txt").read_text().strip() == "3"
    assert [p["filename"] for p in json.loads((out / "probes.json").read_text())["probes"]] == [
        r.filename for r in results]


def test_a_runner_that_does_not_say_so_runs_them_one_at_a_time(tmp_path):
    """An SSH host's probes share one connection: they stay in turn (here: the first one's wait for the others ends
    unmet, and the others find its mark)."""
    marks = tmp_path / "marks"
    marks.mkdir()

    class InTurn(LocalRunner):
        concurrent = False

    quick = MEET.replace("seq 100", "seq 3")
    results = gather(InTurn(), tmp_path / "out",
                     probes=tuple(Probe(f"base-{i}.txt", ("sh", "-c", quick, str(marks), f"m{i}")) for i in range(3)))
    assert [r.exit_code for r in results] == [1, 1, 0]


def test_the_checks_deadline_ends_the_probes_running_at_once(tmp_path):
    """The host check's backstop deadline (SIGALRM in the thread that waits for the probes) kills the probes running at
    once, as it killed the one running alone: the executor would otherwise wait for each to end or time out."""
    import os
    import threading
    import time

    import pytest

    from fleetbench.hosts.check import DeadlinePassed, deadline

    probes = tuple(Probe(f"hang-{i}.txt", ("sh", "-c", f'echo $$ > "{tmp_path}/pid-{i}"; exec sleep 60'), timeout_s=120)
                   for i in range(3))
    started = time.monotonic()
    with pytest.raises(DeadlinePassed):
        with deadline(1, "the host check did not end"):
            gather(LocalRunner(), tmp_path / "out", probes=probes)
    assert time.monotonic() - started < 60  # not the probes' own end
    for thread in threading.enumerate():  # each reaps its killed probe
        if thread.name.startswith("probe hang-"):
            thread.join(timeout=30)
    assert time.monotonic() - started < 60
    pids = [int((tmp_path / f"pid-{i}").read_text()) for i in range(3)]
    for pid in pids:  # killed and reaped: no such process
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_probe_that_starts_after_the_gathering_was_called_off_is_killed_at_once(tmp_path):
    runner = LocalRunner()
    runner.cancel()
    code, _, _ = runner.run(("sleep", "60"), timeout_s=120)
    assert code == -9


def test_a_called_off_gathering_does_not_wait_for_a_probe_whose_output_a_child_holds_open(tmp_path):
    """Killing a probe's shell leaves its child (here `sleep`) holding the probe's output open: the thread reading it
    waits on, but the gathering returns as the deadline passes, and the interpreter could exit (daemon threads)."""
    import threading
    import time

    import pytest

    from fleetbench.hosts.check import DeadlinePassed, deadline

    probes = tuple(Probe(f"hang-{i}.txt", ("sh", "-c", "sleep 20; true"), timeout_s=120) for i in range(2))
    started = time.monotonic()
    with pytest.raises(DeadlinePassed):
        with deadline(1, "the host check did not end"):
            gather(LocalRunner(), tmp_path / "out", probes=probes)
    assert time.monotonic() - started < 20
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("probe "))
