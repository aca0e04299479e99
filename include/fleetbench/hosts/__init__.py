"""Host validation: probes -> facts -> rules -> verdict."""

from fleetbench.hosts.facts import Gpu, HostFacts, facts_from_dir, has_probe_outputs
from fleetbench.hosts.probes import PROBES, HostUnreachable, LocalRunner, gather, gpu_smoke_probe, runner_for
from fleetbench.hosts.rules import Check, HostNeeds, evaluate, host_check, reasons, verdict

__all__ = ["Check", "Gpu", "HostFacts", "HostNeeds", "HostUnreachable", "LocalRunner", "PROBES", "evaluate",
           "facts_from_dir", "gather", "gpu_smoke_probe", "has_probe_outputs", "host_check", "reasons", "runner_for",
           "verdict"]
