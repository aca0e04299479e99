"""command: any image and argv, for a team's own benchmark.

Metrics come from JSON lines on stdout, one sample per line:
``{"metric": "tokens_per_sec", "value": 1234.5, "unit": "tok/s", "better": "higher", "labels": {...}}``
(`better` defaults to lower for time units, higher otherwise; `labels` is optional), and/or from named
regexes of the config, one capture group each. Bad samples (NaN/inf, a non-number, an unknown unit, more
than MAX_METRICS) are dropped and counted; a case without any metric is `no_result`.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Iterable

from fleetbench.files import open_regular
from fleetbench.harnesses.base import CasePoint, Harness, Measured, SampleSink

if TYPE_CHECKING:
    from fleetbench.config import BenchmarkSpec

MAX_PATTERN_CHARS = 500
MATCH_CHARS = 4096  # a line is cut to this before any configured regex sees it
MAX_JSON_LINE_CHARS = 16 * 1024


def backtracking_problem(pattern: str) -> str | None:
    """Why a regex could take exponential time (a repeat inside a repeat, e.g. `(a+)+` or `(\\w*\\s?)*`), or
    None. A static check of the parsed pattern: cheap, and it never runs the pattern."""
    import re._parser as sre_parse
    from re._constants import MAX_REPEAT, MAXREPEAT, MIN_REPEAT

    repeats = {MAX_REPEAT, MIN_REPEAT}
    possessive = getattr(sre_parse, "POSSESSIVE_REPEAT", None)

    def walk(items, inside_repeat: bool) -> str | None:
        for op, av in items:
            if op in repeats:
                lo, hi, sub = av
                unbounded = hi is MAXREPEAT or hi > 1
                if inside_repeat and unbounded:
                    return "a repeat inside a repeat (e.g. (a+)+) can backtrack exponentially"
                found = walk(sub, inside_repeat or unbounded)
            elif op == possessive:
                continue
            elif op is sre_parse.SUBPATTERN:
                found = walk(av[-1], inside_repeat)
            elif op is sre_parse.BRANCH:
                found = next((f for f in (walk(b, inside_repeat) for b in av[1]) if f), None)
            elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
                found = walk(av[1], inside_repeat)
            elif op is sre_parse.GROUPREF_EXISTS:
                found = next((f for f in (walk(b, inside_repeat) for b in av[1:] if b) if f), None)
            else:
                continue
            if found:
                return found
        return None

    return walk(sre_parse.parse(pattern), False)


def pattern_problem(pattern: Any) -> str | None:
    """Why a configured metric regex cannot be used, or None."""
    if not isinstance(pattern, str):
        return "must be a string"
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"must be at most {MAX_PATTERN_CHARS} characters"
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        return f"does not compile: {exc}"
    if compiled.groups != 1:
        return f"must have exactly one capture group (the value), has {compiled.groups}"
    return backtracking_problem(pattern)


class Command(Harness):
    name = "command"
    axes = ("num_gpus",)
    fields = ("command", "metrics")
    primary = ("", "", "higher")  # the config's `metrics.primary`, else the first metric the case prints
    description = "any image and argv; metrics from JSON lines or named regexes"

    def points(self, bench: "BenchmarkSpec") -> list[CasePoint]:
        return [CasePoint(f"{bench.name}.g{gpus}", None, None, gpus, None, {"num_gpus": gpus})
                for gpus in bench.num_gpus]

    def command(self, prefix: Iterable[str], bench: "BenchmarkSpec", point: CasePoint) -> list[str]:
        return list(bench.command) if bench.command else list(prefix)

    def settings(self, bench: "BenchmarkSpec") -> dict:
        metrics = bench.metrics
        if metrics is None:
            return {"json_lines": True, "primary": None, "patterns": []}
        return metrics.model_dump(mode="json")

    def check(self, bench: dict, path: str) -> list[str]:
        metrics = bench.get("metrics")
        if not isinstance(metrics, dict):
            return []
        errors = []
        patterns = metrics.get("patterns")
        for i, p in enumerate(patterns if isinstance(patterns, list) else []):
            if isinstance(p, dict) and "regex" in p:
                problem = pattern_problem(p["regex"])
                if problem:
                    errors.append(f"{path}.metrics.patterns[{i}].regex: {problem}, got {p['regex']!r}")
        if metrics.get("json_lines") is False and not patterns:
            errors.append(f"{path}.metrics: json_lines is off and no patterns are given: nothing would be measured")
        return errors

    def measure(self, path: str, settings: dict) -> Measured:
        from fleetbench.parsing.source import file_lines

        with open_regular(path) as handle:
            return measure_lines(file_lines(handle), settings)


def measure_lines(lines: Iterable[tuple[str, bool]], settings: dict) -> Measured:
    measured = Measured(primary=settings.get("primary"))
    sink = SampleSink(measured)
    json_lines = settings.get("json_lines", True)
    patterns = [(p["metric"], re.compile(p["regex"]), p["unit"], p.get("better")) for p in settings.get("patterns", [])]
    first: str | None = None
    for line, complete in lines:
        stripped = line.strip()
        if json_lines and stripped.startswith("{") and '"metric"' in stripped:
            if not complete or len(stripped) > MAX_JSON_LINE_CHARS:
                measured.drop("cut-off line")
                continue
            try:
                record = json.loads(stripped)
            except ValueError:
                measured.drop("not JSON")
                continue
            if not isinstance(record, dict):
                measured.drop("not JSON")
                continue
            before = len(sink.by_key)
            sink.add(record.get("metric"), record.get("value"), record.get("unit"), record.get("better"),
                     record.get("labels"))
            if first is None and len(sink.by_key) > before and not record.get("labels"):
                first = record.get("metric")
            continue
        for metric, regex, unit, better in patterns:
            found = regex.search(line[:MATCH_CHARS])
            if found:
                try:
                    value = float(found.group(1))
                except (TypeError, ValueError):
                    measured.drop("not a number")
                    continue
                before = len(sink.by_key)
                sink.add(metric, value, unit, better)
                if first is None and len(sink.by_key) > before:
                    first = metric
    sink.done()
    if measured.primary is None:
        measured.primary = first
    return measured


HARNESS = Command()
