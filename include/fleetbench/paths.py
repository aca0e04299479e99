"""Where fleetbench finds its files: the project tree, the data folder, the default config."""

from __future__ import annotations

import os
from pathlib import Path

# include/fleetbench/paths.py -> the project root is two levels above the package.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """Folder for the default SQLite warehouse and run artifacts (`FLEETBENCH_DATA_DIR`, default `.data/`), absolute:
    a relative value is taken from the directory the process runs in when it reads it, once, not at each use (the
    warehouse URL and the run folders built from it then name the same place whatever the process does later)."""
    return Path(os.environ.get("FLEETBENCH_DATA_DIR") or PROJECT_ROOT / ".data").expanduser().absolute()


def default_config_path() -> Path:
    """The fleet config the DAG uses (`FLEETBENCH_CONFIG`, default `include/config/fleet.yaml`)."""
    return Path(os.environ.get("FLEETBENCH_CONFIG") or PROJECT_ROOT / "include" / "config" / "fleet.yaml")


def artifacts_dir() -> Path:
    """Root of per-run artifacts (raw logs, probe outputs): `FLEETBENCH_ARTIFACTS_DIR` or `<data>/artifacts`."""
    return Path(os.environ.get("FLEETBENCH_ARTIFACTS_DIR") or data_dir() / "artifacts").expanduser().absolute()
