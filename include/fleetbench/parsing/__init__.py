"""Benchmark log parsing: tf_cnn_benchmarks and Horovod synthetic benchmark output.

Pure Python, no Airflow imports. ``parse_log`` never raises on any text except
``UnknownFormat`` when asked to auto-detect and nothing fits.
"""

from .cli import cli_parse
from .detect import detect_format, parse_log
from .model import ParsedLog, Step, UnknownFormat

__all__ = [
    "ParsedLog",
    "Step",
    "UnknownFormat",
    "cli_parse",
    "detect_format",
    "parse_log",
]
