"""The shipped GPU catalog (include/config/gpu_catalog.yaml): complete, sourced, and matched to real GPU names."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
import yaml

from fleetbench.config import ConfigError
from fleetbench.hosts import facts_from_dir
from fleetbench.metrics import NUMERIC_FIELDS, catalog_path, load_catalog, load_catalog_or_none, parse_catalog

ROOT = Path(__file__).resolve().parents[2]
HOST_FIXTURES = ROOT / "tests" / "fixtures" / "hosts"
REAL_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "real-logs"  # tests/fixtures/real-logs/SOURCES.md
SHIPPED = ROOT / "include" / "config" / "gpu_catalog.yaml"

# GPU names as nvidia-smi (or an older driver, or TensorFlow) prints them -> the catalog entry.
NAMES = {
    "NVIDIA A100-SXM4-40GB": "A100 SXM4 40GB",
    "NVIDIA A100-SXM4-80GB": "A100 SXM4 80GB",
    "NVIDIA A100-PCIE-40GB": "A100 PCIe 40GB",
    "NVIDIA A100 80GB PCIe": "A100 PCIe 80GB",
    "NVIDIA H100 80GB HBM3": "H100 SXM5 80GB",
    "NVIDIA H100 PCIe": "H100 PCIe 80GB",
    "NVIDIA H200": "H200 SXM 141GB",
    "Tesla V100-SXM2-16GB": "V100 SXM2 16GB",
    "Tesla V100-SXM2-32GB": "V100 SXM2 32GB",
    "Tesla V100-PCIE-16GB": "V100 PCIe 16GB",
    "Tesla V100-PCIE-32GB": "V100 PCIe 32GB",
    "Tesla V100-SXM3-32GB": "V100 SXM3 32GB",
    "Tesla T4": "T4",
    "NVIDIA L4": "L4",
    "NVIDIA A10": "A10",
    "NVIDIA GeForce RTX 2080 Ti": "GeForce RTX 2080 Ti",
    "GeForce RTX 2080 Ti": "GeForce RTX 2080 Ti",
    "NVIDIA GeForce RTX 3070": "GeForce RTX 3070",
    "NVIDIA GeForce RTX 3090": "GeForce RTX 3090",
    "NVIDIA RTX A6000": "RTX A6000",
    "Quadro RTX 8000": "Quadro RTX 8000",
    "Quadro RTX 6000": "Quadro RTX 6000",
}


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(SHIPPED)


@pytest.mark.parametrize("name, entry", sorted(NAMES.items()))
def test_every_required_model_is_found_by_its_nvidia_smi_name(catalog, name, entry):
    assert catalog.lookup(name).name == entry
    assert catalog.lookup(f"  {name.upper()} ").name == entry  # case and spacing do not matter


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA H200 NVL", "NVIDIA RTX 6000 Ada Generation", "NVIDIA A100",
                                  "Tesla V100S-PCIE-32GB", "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce ..."])
def test_lookalikes_are_not_matched(catalog, name):
    assert catalog.lookup(name) is None


def test_no_gpu_and_mixed_gpus_find_nothing(catalog):
    assert catalog.lookup(None) is None and catalog.lookup("") is None
    assert catalog.lookup("NVIDIA A10, NVIDIA H100 80GB HBM3") is None  # HostFacts.gpu_model of a mixed host


def test_names_seen_on_real_machines(catalog):
    # nvidia-smi captured on an H100 host (tests/fixtures/hosts), Lambda's 8x A100 metadata, Lambda logs.
    assert catalog.lookup(facts_from_dir(HOST_FIXTURES / "h100-590-cuda13.1").gpu_model).name == "H100 SXM5 80GB"
    metadata = (REAL_LOGS / "lambda_metadata_8xa100.tsv").read_text()
    gpus = {line.split("\t")[1] for line in metadata.splitlines() if line.startswith("GPU ")}
    assert gpus == {"A100-SXM4-40GB"} and catalog.lookup("A100-SXM4-40GB").name == "A100 SXM4 40GB"
    assert "name: Tesla V100-SXM3-32GB" in (REAL_LOGS / "tfcnn_resnet50_8gpu_lambda-v100-fp16.log").read_text()
    assert "name: GeForce RTX 2080 Ti" in (REAL_LOGS / "tfcnn_resnet50_1gpu_lambda-2080ti-tf115.log").read_text()


def test_every_number_has_a_source_or_is_marked_unsourced(catalog):
    for gpu in catalog.gpus:
        backed = {f for s in gpu.sources for f in s.supports}
        marked = {u.field for u in gpu.unsourced}
        for f in NUMERIC_FIELDS:
            if getattr(gpu, f) is not None:
                assert f in backed | marked, (gpu.name, f)
        assert not backed & marked, (gpu.name, "a field is both sourced and marked unsourced")
        for s in gpu.sources:
            assert s.url.startswith(("https://", "http://")) and s.says
            assert date(2026, 1, 1) <= s.read_on <= date.today(), (gpu.name, s.url)


def test_the_numbers_are_plausible(catalog):
    by_name = {g.name: g for g in catalog.gpus}
    # Datasheet figures the sources state (see the catalog): spot-check a few.
    assert ((by_name["A100 SXM4 40GB"].tdp_w, by_name["A100 PCIe 40GB"].tdp_w, by_name["A100 PCIe 80GB"].tdp_w)
            == (400, 250, 300))
    assert ((by_name["H100 SXM5 80GB"].tdp_w, by_name["H100 PCIe 80GB"].tdp_w, by_name["H200 SXM 141GB"].memory_gib)
            == (700, 350, 141))
    assert (by_name["T4"].tdp_w, by_name["T4"].memory_gib) == (70, 16)
    for g in catalog.gpus:
        assert 1 <= g.memory_gib <= 200 and 50 <= g.tdp_w <= 1000, g.name
        assert g.price_per_gpu_hour_usd is None or 0 < g.price_per_gpu_hour_usd < 20, g.name
        if g.price_per_gpu_hour_usd is None:  # a missing price says why
            assert "price_per_gpu_hour_usd" in {u.field for u in g.unsourced}, g.name


def entry(**over) -> dict:
    base = {"name": "X1", "patterns": ["X1"], "memory_gib": 16, "tdp_w": 100, "price_per_gpu_hour_usd": 1.0,
            "sources": [{"url": "https://example.org/x1", "read_on": "2026-12-01", "supports": ["memory_gib", "tdp_w"],
                         "says": "16 GB, 100 W"}],
            "unsourced": [{"field": "price_per_gpu_hour_usd", "note": "no page"}]}
    base.update(over)
    return base


@pytest.mark.parametrize("bad, message", [
    (entry(unsourced=[]), "gpus[0]: no source and not marked unsourced: price_per_gpu_hour_usd"),
    (entry(tdp_w=-5), "gpus[0].tdp_w: must be > 0.0, got -5"),
    (entry(patterns=["A100("]), "gpus[0].patterns: not a regular expression"),
    (entry(sources=[{"url": "ftp://x", "read_on": "2026-12-01", "supports": ["tdp_w"], "says": "x"}]),
     "gpus[0].sources[0].url"),
    (entry(sources=[{"url": "https://x", "read_on": "2026-12-01", "supports": ["colour"], "says": "x"}]),
     "gpus[0].sources[0].supports[0]: must be one of"),
])
def test_a_broken_catalog_names_the_field(bad, message):
    with pytest.raises(ConfigError) as err:
        parse_catalog({"gpus": [bad]}, "cat.yaml")
    assert message in str(err.value)


def test_duplicate_names_are_refused():
    with pytest.raises(ConfigError, match="duplicate names: X1"):
        parse_catalog({"gpus": [entry(), entry()]})


def test_the_catalog_path_can_be_overridden(tmp_path, monkeypatch):
    assert catalog_path() == SHIPPED
    own = tmp_path / "cat.yaml"
    own.write_text(yaml.safe_dump({"gpus": [entry()]}))
    monkeypatch.setenv("FLEETBENCH_GPU_CATALOG", str(own))
    assert catalog_path() == own
    assert [g.name for g in load_catalog().gpus] == ["X1"]
    assert load_catalog().lookup("NVIDIA X1").tdp_w == 100


def test_a_missing_or_broken_catalog_is_none_for_the_pipeline(tmp_path, caplog):
    assert load_catalog_or_none(tmp_path / "missing.yaml") is None
    broken = tmp_path / "broken.yaml"
    broken.write_text("gpus: [\n")
    assert load_catalog_or_none(broken) is None
    assert "GPU catalog not used" in caplog.text
    with pytest.raises(ConfigError, match="cannot read file"):
        load_catalog(tmp_path / "missing.yaml")


def test_catalog_yaml_errors_name_the_line_and_a_repeated_key(tmp_path):
    """The catalog is read as the fleet config is: a syntax error names its line, and a key given twice (YAML would
    silently keep the last, e.g. a GPU's second `tdp_w`) is an error naming both lines."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("gpus: [\n")
    with pytest.raises(ConfigError, match=r"line \d+, column \d+: invalid YAML"):
        load_catalog(broken)
    twice = tmp_path / "twice.yaml"
    twice.write_text("gpus:\n  - name: X1\n    tdp_w: 100\n    tdp_w: 700\n")
    with pytest.raises(ConfigError, match=r"line 4, column 5: duplicate key 'tdp_w' \(first on line 3\)") as info:
        load_catalog(twice)
    assert str(twice) in str(info.value)
