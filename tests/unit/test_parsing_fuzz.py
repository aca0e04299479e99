"""Fuzz tests: parse_log must never raise (except UnknownFormat under "auto") and
must always return a consistent, JSON-serialisable ParsedLog.

Inputs: random mutations and truncations of every real log and fixture,
random bytes decoded with errors="replace", and a few pathological shapes.
All randomness comes from seeded ``random.Random`` instances.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from fleetbench.parsing import ParsedLog, UnknownFormat, parse_log

REAL_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "real-logs"  # tests/fixtures/real-logs/SOURCES.md
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"

FORMATS = ("auto", "tf_cnn_benchmarks", "horovod_synthetic")
FAILURE_CLASSES = {None, "oom", "nccl", "import_error", "cuda_driver", "no_result", "other_error"}

# Fragments that steer mutations into the parser's interesting paths.
SNIPPETS = (
    "[1,0]<stdout>:", "[1,1]<stderr>:", "[0]<stdout>:", "[999999999,1]<stdout>:", "[1,0]<std",
    "INFO|2020-01-01 00:00:00|host|", "[2024-01-01T00:00:00] {x.py:1} INFO - ",
    "\timages/sec: ", " +/- ", " (jitter = ", "total images/sec: ", "Total img/sec on 4 GPU(s): ",
    "Iter #", " img/sec per GPU", "Batch size:  ", " global", " per device", "Devices:     ['",
    "Model:  ", "Mode: forward only", "Dataset: x (synthetic)", "Accuracy @ 1 = 0.5 Accuracy @ 5 = ",
    "Traceback (most recent call last):\n", "ImportError: x", "OOM when allocating tensor",
    "NCCL error", "CUDA driver version is insufficient", "Killed", "--use_fp16=", "Data type: ",
    "9" * 400, "1e999", "-0.0", "nan", "\r", "\x00", "\ufffd", "\u2028", "\x1c", "é", "\t", "\n",
)  # fmt: skip


def _inputs() -> list[str]:
    paths = sorted(REAL_LOGS.glob("*.log")) + sorted(FIXTURES.glob("*.log"))
    assert len(paths) >= 19
    return [p.read_text(encoding="utf-8", errors="replace") for p in paths]


INPUTS = _inputs()


def check(text: str, fmt: str) -> None:
    """Parse and check every invariant; UnknownFormat is only allowed under auto."""
    try:
        log = parse_log(text, fmt)
    except UnknownFormat:
        assert fmt == "auto"
        return
    assert isinstance(log, ParsedLog)
    assert log.format in ("tf_cnn_benchmarks", "horovod_synthetic")
    if fmt != "auto":
        assert log.format == fmt
    assert log.failure_class in FAILURE_CLASSES
    if log.status == "ok":
        assert log.total_images_per_sec is not None
        assert log.failure_class is None and log.failure_detail is None
    else:
        assert log.status == "failed"
        assert log.failure_class is not None
        assert log.failure_detail and len(log.failure_detail) <= 300
    assert log.step_count == len(log.steps)
    assert log.num_gpus is None or log.num_gpus >= 0
    json.dumps(log.to_dict(), allow_nan=False)


def mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 6)):
        if not text:
            text = rng.choice(SNIPPETS)
        i, j = sorted(rng.randrange(len(text) + 1) for _ in range(2))
        op = rng.randrange(7)
        if op == 0:  # truncate
            text = text[:i]
        elif op == 1:  # delete a slice
            text = text[:i] + text[j:]
        elif op == 2:  # duplicate a slice
            text = text[:j] + text[i:j] + text[j:]
        elif op == 3:  # insert a steering snippet
            text = text[:i] + rng.choice(SNIPPETS) + text[i:]
        elif op == 4:  # random characters, any code point
            junk = "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randint(1, 40)))
            text = text[:i] + junk.encode("utf-8", "replace").decode("utf-8", "replace") + text[i:]
        elif op == 5:  # shuffle a few lines
            lines = text.split("\n")
            k = rng.randint(1, len(lines))
            head = lines[:k]  # a slice is a copy: shuffled, then put back
            rng.shuffle(head)
            text = "\n".join(head + lines[k:])
        else:  # flip characters
            chars = list(text)
            for _ in range(rng.randint(1, 20)):
                if chars:
                    chars[rng.randrange(len(chars))] = chr(rng.randrange(32, 0x3000))
            text = "".join(chars)
    return text


@pytest.mark.parametrize("index", range(len(INPUTS)))
def test_mutated_logs(index):
    rng = random.Random(1000 + index)
    for _ in range(60):
        check(mutate(INPUTS[index], rng), rng.choice(FORMATS))


@pytest.mark.parametrize("index", range(len(INPUTS)))
def test_truncated_at_random_bytes(index):
    data = INPUTS[index].encode("utf-8")
    rng = random.Random(2000 + index)
    for _ in range(40):
        cut = rng.randrange(len(data) + 1)
        check(data[:cut].decode("utf-8", errors="replace"), rng.choice(FORMATS))
        check(data[cut:].decode("utf-8", errors="replace"), "tf_cnn_benchmarks")


def test_random_bytes():
    rng = random.Random(3000)
    for _ in range(1500):
        data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 600)))
        check(data.decode("utf-8", errors="replace"), rng.choice(FORMATS))


def test_random_snippet_soup():
    rng = random.Random(4000)
    for _ in range(1500):
        text = "".join(rng.choice(SNIPPETS) for _ in range(rng.randint(0, 30)))
        check(text, rng.choice(FORMATS))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n" * 10_000,
        "x" * 1_000_000,  # one huge line
        "[1,0]<stdout>:" * 50_000,  # a line of nothing but rank prefixes
        "9" * 100_000 + "\timages/sec: " + "9" * 100_000 + " +/- 1 (jitter = 1)\t" + "9" * 5000,
        "1\timages/sec: 1e999 +/- 1e999 (jitter = 1e999)\t1e999\ntotal images/sec: 1e999\n",
        "Batch size: 1e300 global\n1e300 per device\nNumber of GPUs: 999999999\nBatch size: 1e300\n",
        "Iter #999999999: 1e999 img/sec per GPU\nTotal img/sec on 999999999 GPU(s): 1e999 +-1\n",
        "Traceback (most recent call last):\n" + "A" * 200_000 + "Error: boom\n",
        ("a." * 50_000) + "Error",
        "INFO|" + "|" * 100_000,
        "[2024-01-01" + "]" * 50_000,
    ],
    ids=lambda t: repr(t[:30]),
)
def test_pathological_inputs(text):
    for fmt in FORMATS:
        check(text, fmt)


def test_huge_input():
    text = "\n".join(INPUTS) * 3  # a few MB of real lines from every log at once
    for fmt in FORMATS:
        check(text, fmt)
