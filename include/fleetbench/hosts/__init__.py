"""Host validation: probes -> facts -> rules -> verdict."""

from fleetbench.hosts.facts import Gpu, HostFacts, facts_from_dir
from fleetbench.hosts.probes import PROBES, LocalRunner, gather
from fleetbench.hosts.rules import Check, HostNeeds, evaluate, host_check, reasons, verdict

__all__ = ["Check", "Gpu", "HostFacts", "HostNeeds", "LocalRunner", "PROBES", "evaluate", "facts_from_dir", "gather", "host_check", "reasons", "verdict"]
