"""One (host, case, metric)'s nights, oldest first, replayed into verdicts: baselines per segment, confirmation,
open until accepted or recovered. Pure (plain values in and out); `fleetbench.regression.store` feeds it.

**Segments.** A night's segment is what can move its numbers (`SEGMENT_FIELDS`: driver, CUDA driver,
image digest, host health state). The baseline is one segment's nights (the last `window` of them, from
the baseline's start on). A night in another segment is compared with the baseline as it is; the
new segment becomes the baseline when someone accepts it (an acceptance dated at or before its first
night), or after `accept_after_nights` nights if no confirmed regression is open against it (a neutral
or better change rolls in by itself; a worse one waits for a person).

**A night's test.** Against the baseline values h: median m, noise scale

    s = max(1.4826 x MAD(h), Qn(h), step floor, scale_floor_pct % x |m|)

(MAD and Qn over the longer `scale_window`: a 20-night MAD alone is too often a lucky low) where
the step floor is the median over the baseline nights of the standard error of a night's mean
from its own steps (step_cv / sqrt(step_count), as a fraction of the value). The night is off in the
bad direction when robust z = (x - m) / s reaches `z_threshold` and the change (x - m) / |m| reaches
`min_effect_pct`; in the good direction likewise (an improvement). The smallest change one night can
show, max(min_effect_pct, z_threshold x s / |m| x 100), is the case's detectable effect. A baseline whose
median is not positive (a count that is normally 0, such as failed requests) gives no verdict: a change in %
of it, and the scale's floor in % of it, are not defined.

**Several nights' test.** The candidate nights (a new segment's nights, or the nights since a
suspected or open finding started in the baseline's segment; the last `window`) are tested as one
sample when there are at least 3 (in the baseline's segment: only while each night is still off):
their median against m, with the scale of a median of k values, 1.2533 s / sqrt(k). A median of 3
or more nights is not moved by one outlier night.

**Sustained shifts.** In the baseline's segment, on a night that is not quiet with no confirmed finding open, the
median of the segment's last SUSTAINED_NIGHTS nights (not those of a recovered regression) is tested against the
baseline before them (their median m and the scale of the `scale_window` nights before them) at
SUSTAINED_Z x MEDIAN_SE x s / sqrt(k) and `min_effect_pct`, the same way as the night: a change no single night shows
through the noise, or a drift, which the rolling baseline would take in night by night. It confirms at once
("nights"), from the shift's first night (`_sustained`).

**Usual levels.** A night (or such a median) off its baseline is not off when the segment keeps visiting that level
(`_usual`: several separate visits, none shorter than the current stay): a case that flips between two levels, or
reports few distinct values, has most nights tied, a scale near 0, and read each visit to its other level as a
regression. A level visited once before, or a stay longer than any visit, is judged as any other night.

**Status.** A finding is "suspected" on a night that is off, and "confirmed" when (a) the last
`confirm_nights` nights were each off the same way, (b) the several nights' test says so, or (c) at
once when the change is at least `immediate_effect_pct` on a case whose scale is at most
`low_noise_pct` % of its median. Nights "agree" for (a) when they also sit at one level (no two
further apart than z_threshold x s x sqrt 2), so a one-night outlier next to a merely noisy night
confirms nothing. A confirmed finding stays open (each later night reports it, also a
night that alone looks fine) until it is accepted, its segment becomes the baseline, or it recovers:
the median of its last 3 candidate nights is back within half the minimum effect. The nights of a
finding in the baseline's segment are kept out of the baseline while it is open, so a step change
does not become its own baseline; an improvement there becomes the new level after
`accept_after_nights` nights.

**Size.** A confirmed finding's change (`change_pct`, which its severity is of) is the change's, not one
night's: the candidate nights' median change (the night's own while there are fewer than 3), the largest it
has been since the finding was confirmed. So a change near `major_effect_pct` does not turn minor and major
again night by night, and one that grows turns major.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import operator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from fleetbench.config import RegressionSettings
from fleetbench.regression.detect import MAD_TO_SIGMA, mad, median

# What can move a number: a night in another combination of these is another segment. host_gpu_health is the
# health state of the host's GPUs when the case ran (healthy, degraded, unfit; None where not checked).
SEGMENT_FIELDS = ("driver_version", "cuda_driver_version", "image_digest", "host_gpu_health")
SEGMENT_MIN_NIGHTS = 3  # the several nights' test needs a median of at least this many
_SEGMENT_OF, _MEASURE_OF = operator.attrgetter("segment"), operator.attrgetter("measure")
MEDIAN_SE = 1.2533  # sqrt(pi / 2): the standard error of a median of normal values, in sigma / sqrt(k)
# A night off its baseline is not a change when the segment keeps visiting that level (`_usual`): this share of its
# last scale_window nights, at least this many, at least this part of its distance out the same way, in at least this
# many separate visits, none shorter than the current stay.
USUAL_SHARE, USUAL_MIN_NIGHTS, USUAL_REACH, USUAL_VISITS = 0.05, 3, 0.75, 3
# The sustained-shift test (`_sustained`): the median of the segment's last this many nights, at this many standard
# errors of such a median off the baseline before them.
SUSTAINED_NIGHTS, SUSTAINED_Z = 7, 5.5
# Why the last night has no verdict (`track`'s `why`).
NO_VALUE = "no value"
TOO_FEW = "insufficient history"
NOT_POSITIVE = "its baseline's median is 0 or less (a change in % of it is not defined)"
NO_SCALE = "its noise scale is 0 (its scale window's nights are all 0 and there is no scale floor)"


def segment_of(row: Mapping[str, Any]) -> tuple:
    return tuple(row.get(f) for f in SEGMENT_FIELDS)


def segment_dict(segment: Sequence[Any]) -> dict:
    """The segment as {field: value} for the fields that are set."""
    return {f: v for f, v in zip(SEGMENT_FIELDS, segment) if v is not None}


class NightIn(NamedTuple):
    """One night of one (host, case, metric): its value, segment, step-level noise (fraction) and date. A named
    tuple: a fleet night builds a million of these."""

    value: float | None
    segment: tuple
    when: datetime | None = None
    step_se: float | None = None  # step_cv / sqrt(step_count)
    run_id: str | None = None
    measure: Any = None  # how the value was measured (energy: measured or estimated): never compared across


@dataclass(frozen=True)
class Verdict:
    """A night's verdict. kind/status None: nothing found (the night was compared: `baseline_n` > 0)."""

    index: int
    value: float
    baseline_value: float
    baseline_n: int
    baseline_runs: tuple[str | None, ...]
    baseline_segment: tuple
    scale: float
    z_score: float
    delta_pct: float
    detectable_pct: float
    kind: str | None = None  # "regression" | "improvement"
    status: str | None = None  # "suspected" | "confirmed"
    basis: str | None = None  # "night", "nights" (confirm_nights in a row), "segment" (several nights' median)
    since: int | None = None  # index of the finding's first night
    newly_confirmed: bool = False
    nights_delta_pct: float | None = None  # the candidate nights' median change, when tested
    change_pct: float | None = None  # a confirmed finding's change (its severity's): see the module docstring


@dataclass
class _Open:
    kind: str
    start: int
    confirmed: bool
    confirmed_at: int | None = None
    change: float | None = None  # the largest change in its kind's direction since it was confirmed (delta %)


def _off(z: float, d: float, worse: float, settings: RegressionSettings) -> str | None:
    """"regression" / "improvement" / None for a signed z and delta % (worse = -1 for higher-is-better)."""
    if worse * z >= settings.z_threshold and worse * d >= settings.min_effect_pct:
        return "regression"
    if -worse * z >= settings.z_threshold and -worse * d >= settings.min_effect_pct:
        return "improvement"
    return None


@functools.lru_cache(maxsize=512)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(n, 1)


def qn_scale(values: Sequence[float]) -> float:
    """Rousseeuw and Croux's Qn: 2.2219 x the k-th smallest of the |x_i - x_j| (i < j), k = h (h - 1) / 2,
    h = n // 2 + 1, with the small-sample factor n / (n + 1.4) (n odd) or n / (n + 3.8) (n even). It estimates
    sigma of normal noise, ignores up to half the values as outliers, and is twice as efficient as the MAD."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 2:
        return 0.0
    diffs = np.abs(x[:, None] - x[None, :])[_pairs(n)]
    h = n // 2 + 1
    k = h * (h - 1) // 2
    q = float(np.partition(diffs, k - 1)[k - 1])
    return 2.2219 * q * (n / (n + 1.4) if n % 2 else n / (n + 3.8))


def noise_scale(values: Sequence[float], step_se: Sequence[float], settings: RegressionSettings) -> float:
    """max(1.4826 MAD, Qn, the median step-level standard error x |median|, the floor % x |median|)."""
    m = abs(median(values))
    floor = median(step_se) * m if step_se else 0.0
    return max(MAD_TO_SIGMA * mad(values), qn_scale(values), floor, settings.scale_floor_pct / 100.0 * m)


def track(nights: Sequence[NightIn], direction: str, settings: RegressionSettings | None = None,
          accepted: Sequence[datetime] = (), last_only: bool = False,
          why: list[str] | None = None) -> list[Verdict | None]:
    """Each night's verdict (None: no value, too little baseline, or a baseline median that is not positive: a
    change in % of 0 is not defined), replaying the nights in order.

    `accepted`: the dates from which someone accepted the level as the new baseline (acceptances).
    `last_only`: only the last night's verdict is wanted (the others come back None; the replay is the same).
    `why`: a list that gets why the last night has no verdict (`NO_VALUE`, `TOO_FEW`, `NOT_POSITIVE`), if it has none.
    Each night costs O(window); a stretch of quiet nights (nothing open, the baseline's segment, less than the
    minimum effect off its baseline's median) is replayed at once (`_quiet_stretch`).
    """
    settings = settings or RegressionSettings()
    worse = -1.0 if direction == "higher" else 1.0
    pending = sorted(a for a in accepted if a is not None)
    valid = [n.value is not None and math.isfinite(n.value) for n in nights]
    last = len(nights) - 1
    out: list[Verdict | None] = []
    base_seg: tuple | None = None
    base_from = 0
    open_: _Open | None = None
    run_kind, run_len = None, 0
    seen: dict[tuple, list[int]] = {}  # segment -> its nights with a value since base_from, in order
    excluded: set[int] = set()  # nights of regressions that recovered: never baseline

    def rebase(i: int, upto: int) -> None:
        nonlocal base_seg, base_from, open_, run_kind, run_len
        base_seg, base_from, open_, run_kind, run_len = nights[i].segment, i, None, None, 0
        seen.clear()
        excluded.clear()
        for j in range(i, upto):
            if valid[j]:
                seen.setdefault(nights[j].segment, []).append(j)

    def baseline(limit: int) -> list[int]:
        """The baseline's last `limit` nights before this one, newest first (the nights of an open finding, and of
        a regression that recovered, left out)."""
        idx = seen.get(base_seg, [])
        if open_ is not None:
            idx = idx[:bisect.bisect_left(idx, open_.start)]
        if not excluded:
            return idx[-limit:][::-1]
        out = []
        for j in reversed(idx):
            if j not in excluded:
                out.append(j)
                if len(out) >= limit:
                    break
        return out

    values_of = [n.value for n in nights]
    pos = 0
    while pos <= last:
        i, n = pos, nights[pos]
        if (open_ is None and not excluded and base_seg is not None and i < last and valid[i]
                and n.segment == base_seg and n.measure == nights[base_from].measure
                and not (pending and n.when is not None and n.when >= pending[0])):
            mine = seen.setdefault(base_seg, [])
            end, stretch = _quiet_stretch(nights, values_of, valid, i, last, mine, base_seg,
                                          nights[base_from].measure, pending[0] if pending else None, settings,
                                          verdicts=not last_only)
            if end > i:
                if any(v is not None for v in stretch):
                    run_kind, run_len = None, 0
                out.extend([None] * (end - i) if last_only else [
                    None if v is None else Verdict(index=j, value=values_of[j], baseline_value=v[0],
                                                   baseline_n=v[1], baseline_runs=(), baseline_segment=base_seg,
                                                   scale=math.nan, z_score=math.nan, delta_pct=v[2],
                                                   detectable_pct=math.nan)
                    for j, v in zip(range(i, end), stretch)])
                mine.extend(j for j in range(i, end) if valid[j])
                pos = end
                continue
        pos += 1
        if not valid[i]:
            _no_verdict(out, why, i == last, NO_VALUE)
            continue
        while pending and n.when is not None and n.when >= pending[0]:
            pending.pop(0)
            rebase(i, i)
        if base_seg is None or n.measure != nights[base_from].measure:
            rebase(i, i)
        base_idx = baseline(settings.window)
        if n.segment != base_seg:
            blocked = open_ is not None and open_.kind == "regression" and open_.confirmed
            mine = seen.get(n.segment, [])
            # A baseline still being built moves to another segment only once that one has as many nights: one
            # night elsewhere (a host degraded for a night) threw away the nights gathered so far, and a host whose
            # health flapped never had a baseline at all.
            short = len(base_idx) < settings.min_history and len(mine) + 1 >= len(base_idx)
            if short or (not blocked and len(mine) >= settings.accept_after_nights):
                rebase(mine[0] if mine else i, i)
                base_idx = baseline(settings.window)
        seen.setdefault(n.segment, []).append(i)
        if len(base_idx) < settings.min_history:
            _no_verdict(out, why, i == last, TOO_FEW)
            continue
        values = [nights[j].value for j in base_idx]
        m = median(values)
        if m <= 0:
            _no_verdict(out, why, i == last, NOT_POSITIVE)
            continue
        d = (n.value - m) / abs(m) * 100.0
        if abs(d) < settings.min_effect_pct and open_ is None and n.segment == base_seg and i < last:
            # A quiet night with nothing open: no test can find anything, so the noise scale is not needed.
            run_kind, run_len = None, 0
            out.append(None if last_only else Verdict(index=i, value=n.value, baseline_value=m, baseline_n=len(values),
                               baseline_runs=(), baseline_segment=base_seg, scale=math.nan, z_score=math.nan,
                               delta_pct=d, detectable_pct=math.nan))
            continue
        # The scale's nights include this one (it is in `seen` already) when scale_window > window: a night far out
        # widens its own scale a little, which keeps a short history's underestimated scale from confirming two
        # merely noisy nights (without it, 2 % noise gave false regressions at 12 nights of history).
        scale_idx = base_idx if settings.scale_window <= settings.window else baseline(settings.scale_window)
        s = noise_scale([nights[j].value for j in scale_idx[:settings.scale_window]],
                        [nights[j].step_se for j in base_idx if nights[j].step_se is not None], settings)
        if s <= 0:  # the scale window's nights all 0 (a count just turned positive) with no floor: no z
            _no_verdict(out, why, i == last, NO_SCALE)
            continue
        z = (n.value - m) / s
        night_kind = _off(z, d, worse, settings)
        if night_kind is not None and _usual(nights, seen.get(base_seg, []), i, m, d, settings, excluded=excluded):
            night_kind = None  # a level the case keeps visiting (two modes, few distinct values) is not a change
        # A shift no single night shows through the noise (a 10 % drop at 3 % noise), or a slow drift, which the
        # rolling baseline would take in night by night: the segment's last SUSTAINED_NIGHTS nights against the
        # baseline before them.
        sustained = None
        if n.segment == base_seg and abs(d) >= settings.min_effect_pct and not (open_ is not None and open_.confirmed):
            # not over a recovered regression's nights (it would be found again, dated back to it)
            mine = [j for j in seen[base_seg] if j not in excluded] if excluded else seen[base_seg]
            sustained = _sustained(nights, mine, seen[base_seg], excluded, baseline, worse, d, settings)
        # The candidate nights: a new segment's, or those of the finding open in the baseline's segment.
        mine = seen[n.segment]  # this night's segment, this night included
        if n.segment != base_seg:
            cand = mine[-settings.window:]
        elif open_ is not None:
            cand = mine[bisect.bisect_left(mine, open_.start):][-settings.window:]
        else:
            cand = [i]
        nights_kind, nights_d = None, None
        if len(cand) >= SEGMENT_MIN_NIGHTS:
            cm = median([nights[j].value for j in cand])
            nights_d = (cm - m) / abs(m) * 100.0
            nights_kind = _off((cm - m) / (MEDIAN_SE * s / math.sqrt(len(cand))), nights_d, worse, settings)
        if open_ is not None and not open_.confirmed and open_.start < cand[0]:
            open_, run_len = None, 0  # a suspicion from before this segment began is not this segment's finding
        run_kind, run_len = (night_kind, run_len + 1) if night_kind and night_kind == run_kind else (
            night_kind, 1 if night_kind else 0)
        confirm, basis = None, None
        if sustained is not None:
            confirm, basis, nights_d = sustained[0], "nights", sustained[2]
        elif nights_kind is not None and (n.segment != base_seg or (open_ is not None and night_kind == nights_kind)):
            confirm, basis = nights_kind, "segment" if n.segment != base_seg else "nights"
        elif night_kind and run_len >= settings.confirm_nights and _agree(nights, cand, settings, s):
            confirm, basis = night_kind, "nights"
        elif (night_kind and abs(d) >= settings.immediate_effect_pct
              and s / abs(m) * 100.0 <= settings.low_noise_pct):
            confirm, basis = night_kind, "night"
        newly = False
        if confirm is not None:
            if open_ is None or open_.kind != confirm or not open_.confirmed:
                start = (cand[0] if basis == "segment" else
                         min(sustained[1], open_.start if open_ is not None and open_.kind == confirm else i)
                         if sustained is not None else
                         open_.start if open_ is not None and open_.kind == confirm else i - run_len + 1)
                open_ = _Open(confirm, start, True, i)
                newly = True
        elif open_ is not None and open_.confirmed:
            recent = [nights[j].value for j in cand[-SEGMENT_MIN_NIGHTS:]]
            back = len(recent) >= SEGMENT_MIN_NIGHTS and (
                (median(recent) - m) / abs(m) * 100.0 * (worse if open_.kind == "regression" else -worse)
                < settings.min_effect_pct / 2)
            if back:
                if open_.kind == "regression":
                    excluded.update(range(open_.start, i - SEGMENT_MIN_NIGHTS + 1))
                open_ = None
            elif (open_.kind == "improvement" and n.segment == base_seg
                  and i - open_.start >= settings.accept_after_nights):
                rebase(open_.start, i + 1)  # the better level is the new normal
        elif night_kind:
            if open_ is None or open_.kind != night_kind:
                open_ = _Open(night_kind, i, False)
        else:
            open_ = None
        if open_ is not None and open_.confirmed:
            change = nights_d if nights_d is not None else d
            toward = worse if open_.kind == "regression" else -worse
            if open_.change is None or toward * change > toward * open_.change:
                open_.change = change
        common = dict(index=i, value=n.value, baseline_value=m, baseline_n=len(values),
                      baseline_runs=tuple(nights[j].run_id for j in base_idx), baseline_segment=base_seg,
                      scale=s, z_score=z, delta_pct=d, nights_delta_pct=nights_d,
                      detectable_pct=max(settings.min_effect_pct, settings.z_threshold * s / abs(m) * 100.0))
        if last_only and i < last:
            out.append(None)
        elif open_ is not None and open_.confirmed:
            out.append(Verdict(**common, kind=open_.kind, status="confirmed", basis=basis or "open",
                               since=open_.start, newly_confirmed=newly, change_pct=open_.change))
        elif open_ is not None:
            out.append(Verdict(**common, kind=open_.kind, status="suspected", basis="night", since=open_.start))
        else:
            out.append(Verdict(**common))
    return out


def _sustained(nights: Sequence[NightIn], mine: Sequence[int], seen: Sequence[int], excluded: set[int], baseline,
               worse: float, tonight_d: float, settings: RegressionSettings) -> tuple[str, int, float] | None:
    """(kind, first night, change %) when the median of the baseline segment's last SUSTAINED_NIGHTS nights (`mine`'s,
    this one included) is off the median of the `window` baseline nights before them by `min_effect_pct` and
    SUSTAINED_Z x the standard error of such a median (MEDIAN_SE x s / sqrt(k), s the noise scale of the
    `scale_window` nights before them), this night is off its baseline (`tonight_d` %) the same way, and that level is
    not one the segment keeps visiting (`_usual` over `seen`, the segment's nights with those of recovered
    regressions, for its 7-night medians and for its nights; `mine` has those left out, so a recovered regression is
    not found again); else None.
    Under steady normal noise a median of 7 that far out needs 4 of the 7 nights beyond 2.6 sigma (about once in 65
    million nights), rarer than the two nights in a row beyond z_threshold that confirm otherwise; replayed
    on 200 steady series at 0.5-5 % noise it confirmed nothing."""
    last = mine[-SUSTAINED_NIGHTS:]
    if len(last) < SUSTAINED_NIGHTS:
        return None
    before = [j for j in baseline(settings.scale_window + SUSTAINED_NIGHTS) if j < last[0]]
    if len(before) < settings.window:  # a whole baseline: a short history's scale is too often a lucky low
        return None
    base = [nights[j].value for j in before[:settings.window]]
    m = median(base)
    if m <= 0:
        return None
    s = noise_scale([nights[j].value for j in before[:settings.scale_window]],
                    [nights[j].step_se for j in before[:settings.window] if nights[j].step_se is not None], settings)
    if s <= 0:
        return None
    km = median([nights[j].value for j in last])
    d = (km - m) / abs(m) * 100.0
    z = (km - m) / (MEDIAN_SE * s / math.sqrt(SUSTAINED_NIGHTS))
    kind = "regression" if worse * d >= settings.min_effect_pct and worse * z >= SUSTAINED_Z else (
        "improvement" if -worse * d >= settings.min_effect_pct and -worse * z >= SUSTAINED_Z else None)
    if (kind is None or tonight_d * d <= 0
            or _usual(nights, seen, last[0], m, d, settings, window=SUSTAINED_NIGHTS, excluded=excluded)
            or _usual(nights, seen, last[-1], m, d, settings, excluded=excluded)):  # nor the nights'
        return None
    # since: the shift's first night, not the first of the k nights (some may be from before it): the first of them
    # that is at least half the change out with the median of it and the nights after it so too (a noisy night
    # inside the shift does not move its start)
    sign = 1.0 if d > 0 else -1.0

    def out(v: float) -> bool:
        return sign * (v - m) / abs(m) * 100.0 >= abs(d) / 2

    start = next((j for t, j in enumerate(last) if out(nights[j].value)
                  and out(median([nights[k].value for k in last[t:]]))), last[0])
    return kind, start, d


def _usual(nights: Sequence[NightIn], base: Sequence[int], upto: int, m: float, off_d: float,
           settings: RegressionSettings, window: int = 1, excluded: set[int] = frozenset()) -> bool:
    """Whether a night (`window` 1) or the median of the last `window` nights, `off_d` % off the baseline median `m`
    at `upto`, is at a level the baseline's segment keeps visiting: a case that flips between two levels (PCIe or NUMA
    placement, boost states) or reports few distinct values has most nights tied, a noise scale near 0, and read each
    visit to its other level as a regression. "Far out": at least USUAL_REACH of `off_d` from `m` the same way.

    A night: among the segment's last `scale_window` nights before the current stretch of far-out ones (recovered
    regressions' nights included), at least USUAL_VISITS separate visits far out, USUAL_SHARE and USUAL_MIN_NIGHTS of
    the nights, and the current stretch no longer than the longest earlier visit. So a first drop to a new level, a
    level visited once or twice before (a regression that came back) and a stay longer than any earlier visit are
    judged as before. A median of `window` nights (from `upto` on): USUAL_SHARE and USUAL_MIN_NIGHTS of the medians of
    `window` nights among the segment's `scale_window` nights before `upto` were far out too, in at least USUAL_VISITS
    separate stretches of such medians (one stay, however long, is one stretch)."""
    sign = 1.0 if off_d > 0 else -1.0
    reach = USUAL_REACH * abs(off_d)
    if window > 1:
        before = base[:bisect.bisect_left(base, upto)][-settings.scale_window:]
        values = [nights[j].value for j in before]
        far = [sign * (median(values[t - window + 1:t + 1]) - m) / abs(m) * 100.0 >= reach
               for t in range(window - 1, len(values))]
        # a run of far-out medians is one visit (a stay of a few nights is in several windows)
        visits = [len(list(g)) for k, g in itertools.groupby(far) if k]
        return len(visits) >= USUAL_VISITS and sum(far) >= max(USUAL_MIN_NIGHTS, USUAL_SHARE * len(far))
    idx = base[:bisect.bisect_right(base, upto)][-(2 * settings.scale_window):]
    far = [sign * (nights[j].value - m) / abs(m) * 100.0 >= reach for j in idx]
    run = 0  # the current stretch of far-out nights, this one included
    while run < len(far) and far[-1 - run]:
        run += 1
    ref = list(zip(idx, far))[:len(far) - run][-settings.scale_window:]
    # a visit: a run of far-out nights; the nights of a recovered regression are one visit however the noise split
    # them (it was one stay: a regression that comes back is not a level the case keeps visiting)
    groups = itertools.groupby(ref, key=lambda night: "recovered" if night[0] in excluded else night[1])
    visits = [v for k, g in groups if k and (v := sum(f for _, f in g))]
    return (len(visits) >= USUAL_VISITS and sum(visits) >= max(USUAL_MIN_NIGHTS, USUAL_SHARE * len(ref))
            and run <= max(visits))


def _no_verdict(out: list, why: list[str] | None, last: bool, reason: str) -> None:
    out.append(None)
    if last and why is not None:
        why.append(reason)


def _quiet_stretch(nights: Sequence[NightIn], values: Sequence[float | None], valid: Sequence[bool], start: int,
                   last: int, base: Sequence[int], segment: tuple, measure: Any, pending: datetime | None,
                   settings: RegressionSettings,
                   verdicts: bool = True) -> tuple[int, list[tuple[float, int, float] | None]]:
    """The quiet nights from `start` on, at once: what the replay's quiet-night path does one night at a time.

    From `start` (nothing open, no recovered regression's nights excluded), while a night is in the baseline's
    `segment` with its `measure`, before the next acceptance (`pending`) and before the last night: each
    valid night's baseline is the last `window` nights of `base` (the baseline's nights so far) and of the
    stretch before it, and the night is quiet when it is less than `min_effect_pct` off their median. The
    stretch ends before the first night that is not quiet (the replay judges it in full). Returns the end
    (exclusive) and, per night, None (no value, too little baseline, a median <= 0) or (median, baseline
    nights, change %). `verdicts` False (only the last night's verdict is wanted): the list is [()] when a night
    of the stretch was judged, else empty (all the replay needs of it)."""
    part = nights[start:last]
    if (pending is None and list(map(_SEGMENT_OF, part)).count(segment) == len(part)
            and list(map(_MEASURE_OF, part)).count(measure) == len(part)):
        idx, end = list(itertools.compress(range(start, last), valid[start:last])), last  # one segment: no scan
    else:
        idx, end = _scan(nights, valid, start, last, segment, measure, pending)
    if not idx:
        return start, []
    w, p = settings.window, len(base)
    arr = np.fromiter(map(values.__getitem__, (*base[-w:], *idx)), dtype=float)
    p = min(p, w)  # arr starts with at most `window` baseline nights
    meds = np.full(len(idx), np.nan)
    k = np.minimum(np.arange(p, p + len(idx)), w)
    full = np.flatnonzero(p + np.arange(len(idx)) >= w)
    if len(full):  # the median of each full window: its middle value(s) by partition, as np.median takes them
        windows = np.lib.stride_tricks.as_strided(arr[p + int(full[0]) - w:], shape=(len(full), w),
                                                  strides=(arr.strides[0], arr.strides[0]), writeable=False)
        half = w // 2
        if w % 2:
            meds[full] = np.partition(windows, half, axis=1)[:, half]
        else:
            part = np.partition(windows, (half - 1, half), axis=1)
            meds[full] = (part[:, half - 1] + part[:, half]) / 2.0
    early = min(len(idx), max(w - p, 0))  # nights whose baseline is all the nights before them (fewer than w)
    if early:
        ordered = sorted(arr[:p].tolist())
        for t in range(early):
            size = p + t
            if size >= settings.min_history:
                half = size // 2
                meds[t] = ordered[half] if size % 2 else (ordered[half - 1] + ordered[half]) / 2.0
            bisect.insort(ordered, float(arr[p + t]))
    vals = arr[p:]
    with np.errstate(divide="ignore", invalid="ignore"):
        d = (vals - meds) / np.abs(meds) * 100.0
    judged = (k >= settings.min_history) & (meds > 0)
    loud = np.flatnonzero(judged & ~(np.abs(d) < settings.min_effect_pct))
    stop = int(loud[0]) if len(loud) else len(idx)
    end = idx[stop] if stop < len(idx) else end
    if not verdicts:
        return end, [()] if judged[:stop].any() else []
    info: dict[int, tuple[float, int, float]] = {
        idx[t]: (float(meds[t]), int(k[t]), float(d[t])) for t in range(stop) if judged[t]}
    return end, [info.get(j) for j in range(start, end)]


def _scan(nights: Sequence[NightIn], valid: Sequence[bool], start: int, last: int, segment: tuple, measure: Any,
          pending: datetime | None) -> tuple[list[int], int]:
    """The valid nights from `start` on before the first valid one in another segment or measure, or at or after the
    next acceptance (or the last night), and where that stretch ends (exclusive)."""
    idx = []
    end = last
    for j in range(start, last):
        if valid[j]:
            n = nights[j]
            if n.segment != segment or n.measure != measure or (pending and n.when is not None and n.when >= pending):
                end = j
                break
            idx.append(j)
    return idx, end


def _agree(nights: Sequence[NightIn], cand: Sequence[int], settings: RegressionSettings, s: float) -> bool:
    """The last `confirm_nights` candidate nights sit at one level: no two further apart than z_threshold x s x
    sqrt 2 (the spread of a difference of two nights). A one-night outlier next to a merely noisy night does not
    agree with it."""
    last = [nights[j].value for j in cand[-settings.confirm_nights:]]
    return len(last) >= settings.confirm_nights and max(last) - min(last) <= settings.z_threshold * s * math.sqrt(2)
