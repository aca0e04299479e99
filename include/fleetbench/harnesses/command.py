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
from fleetbench.harnesses.base import CasePoint, Harness, Measured, SampleSink, default_better
from fleetbench.telemetry.wrapper import MARKER as TELEMETRY_MARKER

if TYPE_CHECKING:
    from fleetbench.config import BenchmarkSpec

MAX_PATTERN_CHARS = 500
MATCH_CHARS = 1024  # a line is cut to this before any configured regex sees it
MAX_JSON_LINE_CHARS = 16 * 1024


# Characters a single-character matcher is tested against when two of them are compared.
_SAMPLE_CHARS = [chr(c) for c in range(256)] + ["\u00e9", "\u2003", "\u4e2d", "\u0663"]


def backtracking_problem(pattern: str) -> str | None:
    r"""Why a regex could take more than linear time per start position, or None. A static check of the parsed
    pattern (cheap; it never runs the pattern against a log). Refused:

    - a repeat (`+`, `*`, `{m,n}` with n > 1) of anything but one character or class, e.g. `(a+)+`,
      `(a|aa)*`, `(?:ab)*`: exponential, or polynomial with overlapping alternatives;
    - two repeats that can match the same characters with nothing between them that the first cannot match,
      e.g. `.*.*`, `\d*\d*`, `.*(\d+)`, `x.*y.*(\d+)` (each such pair multiplies the work by the line's length);
    - backreferences.

    What passes is at most quadratic per line (search tries each start), and lines are cut to MATCH_CHARS.
    """
    import re._compiler as sre_compile
    import re._parser as sre_parse
    from re._constants import MAX_REPEAT, MAXREPEAT, MIN_REPEAT

    parsed = sre_parse.parse(pattern)
    possessive = getattr(sre_parse, "POSSESSIVE_REPEAT", None)
    atomic = getattr(sre_parse, "ATOMIC_GROUP", None)
    repeats = {MAX_REPEAT, MIN_REPEAT, possessive} - {None}
    single = {sre_parse.LITERAL, sre_parse.NOT_LITERAL, sre_parse.ANY, sre_parse.IN, sre_parse.CATEGORY}
    cache: dict[int, frozenset] = {}

    def chars(item) -> frozenset:
        """The sample characters one single-character matcher matches."""
        key = id(item)
        if key not in cache:
            matcher = sre_compile.compile(sre_parse.SubPattern(parsed.state, [item]))
            cache[key] = frozenset(c for c in _SAMPLE_CHARS if matcher.fullmatch(c))
        return cache[key]

    class Problem(Exception):
        pass

    def walk(items, pending: list[frozenset]) -> list[frozenset]:
        """Walk a sequence; `pending`: the character sets of earlier repeats not yet closed by a character they
        cannot match. Returns the sets still pending after the sequence."""
        for op, av in items:
            if op in repeats:
                lo, hi, sub = av
                if hi is MAXREPEAT or hi > 1:
                    if len(sub) != 1 or sub[0][0] not in single:
                        raise Problem("a repeated group (e.g. (a+)+, (a|aa)*, (?:ab)*) can backtrack exponentially: "
                                      "repeat one character or class only")
                    mine = chars(sub[0])
                    if any(mine & other for other in pending):
                        raise Problem("two repeats can match the same characters with nothing between them that "
                                      "separates them (e.g. .*.*, .*(\\d+)): put a character the first cannot "
                                      "match between them")
                    pending = pending + [mine]
                elif lo == 0:  # optional: pending after it is either path's
                    pending = _union(pending, walk(sub, pending))
                else:
                    pending = walk(sub, pending)
            elif op in single:  # a mandatory character: it closes the repeats that cannot match it
                mine = chars((op, av))
                pending = [other for other in pending if mine <= other]
            elif op is sre_parse.SUBPATTERN:
                pending = walk(av[-1], pending)
            elif op is atomic:
                pending = walk(av, pending)
            elif op is sre_parse.BRANCH:
                pending = _union(*(walk(branch, pending) for branch in av[1]))
            elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
                walk(av[1], [])  # a lookaround matches on its own
            elif op in (sre_parse.GROUPREF, sre_parse.GROUPREF_EXISTS):
                raise Problem("backreferences are not allowed")
        return pending

    try:
        walk(parsed, [])
    except Problem as exc:
        return str(exc)
    return None


def _union(*lists: list[frozenset]) -> list[frozenset]:
    out: list[frozenset] = []
    for sets in lists:
        out += [s for s in sets if s not in out]
    return out


def pattern_problem(pattern: Any) -> str | None:
    """Why a configured metric regex cannot be used, or None."""
    if not isinstance(pattern, str):
        return "must be a string"
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"must be at most {MAX_PATTERN_CHARS} characters"
    try:
        compiled = re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as exc:  # OverflowError: a repeat count of 2**32 or more
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

    def primary_metric(self, settings: dict) -> tuple[str | None, str | None, str | None]:
        """`metrics.primary`, with the unit and direction of its named regex; a JSON metric line brings its own
        (unknown until printed)."""
        metric = settings.get("primary")
        pattern = next((p for p in settings.get("patterns") or [] if p.get("metric") == metric), None)
        if not metric or pattern is None:
            return metric or None, None, None
        return metric, pattern["unit"], pattern.get("better") or default_better(pattern["unit"])

    def check(self, bench: dict, path: str) -> list[str]:
        metrics = bench.get("metrics")
        if not isinstance(metrics, dict):
            return []
        errors = []
        patterns = metrics.get("patterns")
        for i, p in enumerate(patterns if isinstance(patterns, list) else []):
            if isinstance(p, dict) and isinstance(p.get("regex"), str):  # another type: the field's own check says so
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
        at = line.find(TELEMETRY_MARKER)
        if at >= 0:  # the telemetry wrapper's report (after what the benchmark printed last): its keys are no metrics
            line = line[:at]
        stripped = line.strip()
        if json_lines and stripped.startswith("{") and '"metric"' in stripped:
            if len(stripped) > MAX_JSON_LINE_CHARS:
                measured.drop("cut-off line")
                continue
            try:  # a last line without a line break that parses is whole: its closing brace ends it
                record = json.loads(stripped)
            except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
                measured.drop("not JSON" if complete else "cut-off line")
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
