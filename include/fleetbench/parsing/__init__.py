"""Benchmark log parsing: tf_cnn_benchmarks and Horovod synthetic benchmark output.

Pure Python, no Airflow imports. ``parse_log`` never raises on any text except
``UnknownFormat`` when asked to auto-detect and nothing fits. ``parse_log_file``
streams a file (regular files only) instead of holding it in memory.
"""

from .cli import cli_parse
from .detect import detect_format, parse_log, parse_log_file
from .model import ParsedLog, Step, UnknownFormat
from .source import NotRegularFile

__all__ = [
    "NotRegularFile",
    "ParsedLog",
    "Step",
    "UnknownFormat",
    "cli_parse",
    "detect_format",
    "parse_log",
    "parse_log_file",
]
