"""One host's check for a run: gather its facts (with a backstop deadline), judge them against what its cases need.

The `validate_host` task is this plus the run's folders; `fleetbench.hosts` holds the probes, facts and rules.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from fleetbench.config import GB
from fleetbench.run_model import HostVerdict, PlannedHost

log = logging.getLogger(__name__)


def check_host(host: PlannedHost, folder: Path, timeout_s: float | None = None) -> HostVerdict:
    """Gather the host's facts into `folder` and judge them against the host's needs.

    When the host's cases need GPUs, a GPU smoke container runs too (`gpu_smoke_image`, else the
    host's benchmark image of the oldest CUDA: `smoke_default`). An unreachable host is a verdict
    (`reachable: fail`), not a crash; so is a check that has not ended after `timeout_s` (every probe
    has its own timeout: this is the backstop for one that hangs regardless, e.g. in an SSH library).
    """
    from fleetbench.hosts import HostFacts, HostNeeds, evaluate, facts_from_dir, gather, reasons, runner_for, verdict
    from fleetbench.hosts.probes import health_probes

    needs = HostNeeds(gpus=host.needs.gpus, image_cuda=host.needs.image_cuda, min_free_bytes=int(host.min_free_gb * GB),
                      health=host.gpu_health.thresholds(), whole_gpus=host.needs.whole_gpus,
                      fewest_whole_gpus=host.needs.fewest_whole_gpus, mig=dict(host.needs.mig))
    smoke_image = (host.gpu_smoke_image or smoke_default(host.images)) if needs.gpus else None
    health = (health_probes(host.gpu_health.xid_window_hours, host.gpu_health.dcgm_diag_level) if needs.gpus
              else ())
    try:
        with deadline(timeout_s, f"the host check of {host.name} did not end within {timeout_s} s"):
            gather(runner_for(host.connection, host.docker_url), folder, gpu_smoke_image=smoke_image, extra=health,
                   path=tuple(host.probe_path))
        facts = facts_from_dir(folder)
    except (Exception, DeadlinePassed) as exc:  # e.g. the artifact folder cannot be written: still a verdict
        log.exception("gathering facts on %s failed", host.name)
        facts = HostFacts(unreachable=f"facts could not be gathered: {exc}")
    if host.connection != "local" and facts.docker_engine_id and not facts.unreachable:
        facts.case_engine_id = case_engine_id(host)  # the `engine` check: are the probes' and the cases' one?
    checks = evaluate(facts, needs)
    return HostVerdict(host=host.name, verdict=verdict(checks), reasons=reasons(checks),
                       checks=[c.to_dict() for c in checks], facts=facts.to_dict(), facts_dir=str(folder),
                       collected_at=datetime.now(timezone.utc).isoformat())


def smoke_default(images) -> str | None:
    """The GPU smoke container's image when the host names none: of its benchmark images the one of the oldest CUDA
    (one whose CUDA the driver cannot run would fail the smoke container, and the host with it, for that image
    alone), else the first."""
    known = [i for i in images if i.cuda]
    if known:
        return min(known, key=lambda i: tuple(int(p) for p in i.cuda.split("."))).ref
    return images[0].ref if images else None


def case_engine_id(host: PlannedHost) -> str | None:
    """The ID of the Docker engine at the host's docker_url (the one its images and cases go to), as `docker info`
    gives it; None when it does not answer (the image step then says so: docker_unreachable)."""
    from fleetbench.engines import engine_client

    try:
        with engine_client(host.docker_url, host.docker_tls_conn_id, timeout=60) as api:
            engine_id = api.info().get("ID")
    except Exception as exc:  # noqa: BLE001 - unreachable, TLS settings: not this check's verdict
        log.warning("host %s: the Docker engine at %s did not say its ID: %s", host.name, host.docker_url, exc)
        return None
    return engine_id if isinstance(engine_id, str) and engine_id else None


class DeadlinePassed(BaseException):
    """Raised by `deadline` when its time is up. Not an Exception (and so not an OSError, as TimeoutError is): the
    probes' runners turn OSErrors into a failed probe or an unreachable host and go on, which would swallow it."""


@contextmanager
def deadline(seconds: float | None, message: str):
    """Raise DeadlinePassed(message) in this thread once `seconds` have passed (SIGALRM: the main thread of a task's
    process, where an operator runs). None, or not the main thread: no deadline. An alarm already set (Airflow's
    execution_timeout) is set again afterwards for the time it had left."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum, frame):
        raise DeadlinePassed(message)

    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, expired)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 0.001))
