"""Which devices of its host a GPU case runs on: whole GPUs, or MIG instances of the profile it asks for.

A GPU in MIG mode has no whole GPU to give: CUDA runs only on its MIG devices (a GPU instance with a
compute instance), and a container given the parent GPU sees no usable device. So:

- a whole-GPU case runs on GPUs without MIG; when MIG is on somewhere on the host, its device request
  names the GPUs without MIG by UUID (a plain `--gpus N` may pick a GPU in MIG mode), and with fewer of
  them than it asks for it is skipped as `mig_enabled`;
- a MIG case (a benchmark with `mig_profiles`) runs on `num_gpus` MIG devices of its profile, named by
  their `MIG-` UUIDs (`nvidia-smi -L`); a host with fewer of them is skipped as `mig_unavailable`;
- a whole-GPU case that asks for more GPUs than the host has is skipped as `too_few_gpus` (a fleet-wide
  `num_gpus: [1, 2, 4, 8]` on a smaller host): the host runs the cases that fit;
- a GPU case whose image needs a CUDA version the host's driver cannot run (`driver_cuda`'s rules, against the
  case's own image) is skipped as `driver_too_old`: one new image does not make the whole host unfit.

A GPU is in MIG mode when `nvidia-smi -q` says its current MIG mode is Enabled, or `nvidia-smi -L` lists
MIG devices under it. Pure functions over a host's facts; the lane runs one case at a time, so every
case may take the same first devices.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetbench.hosts.facts import HostFacts
from fleetbench.hosts.rules import check_driver_for_cuda


@dataclass(frozen=True)
class Devices:
    """A case's devices: `device_ids` for the device request (None: as the case's gpu_selection says), or
    why it cannot run here (`skip_class`, a failure class, and `skip_detail`)."""

    device_ids: tuple[str, ...] | None = None
    mig_profile: str | None = None
    skip_class: str | None = None
    skip_detail: str | None = None

    @property
    def skipped(self) -> bool:
        return self.skip_class is not None


def mig_gpus(health: list[dict] | None, gpu_list: list[dict] | None) -> dict[int, list[dict]]:
    """GPU index -> its MIG devices ([{"profile", "device", "uuid"}], [] when none are listed), for every GPU in
    MIG mode."""
    out: dict[int, list[dict]] = {}
    for gpu in health or []:
        if gpu.get("mig_mode") == "Enabled" and isinstance(gpu.get("index"), int):
            out[gpu["index"]] = []
    for gpu in gpu_list or []:
        if gpu.get("mig") or gpu["index"] in out:
            out[gpu["index"]] = list(gpu.get("mig") or [])
    return dict(sorted(out.items()))


def inventory(mig: dict[int, list[dict]], health: list[dict] | None = None) -> str:
    """'GPU 0: 4x 1g.20gb; GPU 1: 2x 3g.40gb, 1x 1g.10gb' ('GPU 2: no MIG device' for one without instances).

    Profiles come from `nvidia-smi -L`; without its listing, `nvidia-smi -q` still counts a GPU's MIG devices
    (`health`), and saying "no MIG device" there would be wrong."""
    counted = {g.get("index"): g.get("mig_devices") for g in health or []}
    parts = []
    for index, devices in mig.items():
        counts: dict[str, int] = {}
        for d in devices:
            counts[d["profile"]] = counts.get(d["profile"], 0) + 1
        what = ", ".join(f"{n}x {p}" for p, n in counts.items())
        if not what and counted.get(index):
            what = f"{counted[index]} MIG device(s), profiles unknown without nvidia-smi -L"
        parts.append(f"GPU {index}: {what or 'no MIG device'}")
    return "; ".join(parts) or "no GPU in MIG mode"


def host_mig(facts: HostFacts) -> dict[int, list[dict]]:
    return mig_gpus(facts.gpu_health, facts.gpu_list)


def _gpus(facts: HostFacts) -> list[tuple[int, str | None]]:
    """(index, UUID) of every GPU: the query's list, else nvidia-smi -L's."""
    if facts.gpus:
        return sorted((g.index, g.uuid) for g in facts.gpus)
    return sorted((g["index"], g.get("uuid")) for g in facts.gpu_list or [])


def assign(case, facts: HostFacts) -> Devices:
    """The devices of `case` (fleetbench.plan.Case) on the host of `facts`."""
    want = case.num_gpus
    profile = getattr(case, "mig_profile", None)
    if not want:
        return Devices()
    if cuda := getattr(case, "cuda", None):
        driver = check_driver_for_cuda(facts.driver_version, cuda, [g.name for g in facts.gpus or []],
                                       facts.cuda_driver_version)
        if driver.status == "fail":
            return Devices(mig_profile=profile, skip_class="driver_too_old",
                           skip_detail=f"the case's image {case.image} needs CUDA {cuda}: {driver.detail}")
    mig = host_mig(facts)
    if profile:
        if facts.gpu_list is None:
            why = facts.unknown.get("gpu_list", "nvidia-smi -L was not captured")
            return Devices(mig_profile=profile, skip_class="mig_unavailable",
                           skip_detail=f"the case asks for {want} MIG instance(s) of {profile}, and the host's MIG "
                                       f"devices are unknown ({why})")
        instances = [d for devices in mig.values() for d in devices if d["profile"] == profile]
        if len(instances) < want:
            return Devices(mig_profile=profile, skip_class="mig_unavailable",
                           skip_detail=f"the case asks for {want} MIG instance(s) of {profile}; the host has "
                                       f"{len(instances)} ({inventory(mig, facts.gpu_health)})")
        return Devices(device_ids=tuple(d["uuid"] for d in instances[:want]), mig_profile=profile)
    if not mig:
        if facts.gpus is not None and want > len(facts.gpus):
            return Devices(skip_class="too_few_gpus",
                           skip_detail=f"the case needs {want} GPU(s); the host has {len(facts.gpus)}"
                                       + (f" ({facts.gpu_model})" if facts.gpu_model else ""))
        return Devices()
    whole = [(index, uuid) for index, uuid in _gpus(facts) if index not in mig]
    if len(whole) < want:
        return Devices(skip_class="mig_enabled",
                       skip_detail=f"the case needs {want} whole GPU(s), and MIG is enabled on GPU "
                                   f"{', '.join(map(str, mig))} ({inventory(mig, facts.gpu_health)}): "
                                   f"{len(whole)} GPU(s) without MIG (disable MIG there, or give the benchmark "
                                   "mig_profiles to run on the instances)")
    return Devices(device_ids=tuple(uuid or str(index) for index, uuid in whole[:want]))
