"""A memory of past use: each queue's allocation over time, decayed by a half-life.

KAI-Scheduler's time-based fair share, kept by Tessera itself (KAI asks Prometheus):
the gang-coordinator sees every grant and release, so it samples what each queue holds
and integrates it here; the state is small and stored in a KV bucket, so a restart
forgets nothing (services/gang_coordinator/usage.py).

- **Usage** of a queue, per resource dimension: ``U = ∫ A(t) · 0.5^((now - t) / t½) dt``
  over the last ``window_s`` (``A``: what it held at ``t``); ``half_life_s`` 0 means no
  decay, a plain sum over the window, as KAI reads an unset half-life.
- **Normalized**, as KAI's: the same integral over the cluster's capacity divides it,
  so a queue that held a tenth of every card for the whole window has usage 0.1.
- **Where it counts** (shared/core/queues.py ``weigh``): only in the division of what is
  left above what queues are owed. Each queue's weight among those still wanting more becomes
  ``max(0, nW + k·(nW - nU))``, ``nW`` its weight over theirs, ``nU`` its normalized
  usage, ``k`` the ``weight`` (KAI's ``kValue``): a queue that used more lately gets less
  of the surplus, one that used less gets more; guarantees and deserved quotas are
  untouched. ``k`` 0 keeps usage shown but out of every share.

Time is kept in buckets of ``window_s / BUCKETS`` (at least ``MIN_BUCKET_S``), so that
use older than the window can be dropped: what a queue held during a bucket is
integrated into it exactly, decayed to the bucket's end (``∫ A · 0.5^((end - t) / t½)
dt`` over each stretch at one rate), and decayed from that end when read. The decay is
exact whatever the bucket's length against the half-life; only the window's edge is
kept to a bucket. Nothing here reads a clock: the caller passes ``now`` (wall-clock
seconds, so a stored memory means the same after a restart).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import msgspec

from shared.core.queues import EPS, Resources, accumulate

BUCKETS = 168
"""Buckets per window: an hour each over KAI's default week."""
MIN_BUCKET_S = 1.0
CAPACITY = ""
"""The key the cluster's capacity is kept under, beside the queues."""


@dataclass(frozen=True, slots=True)
class UsageParams:
    """``scheduler.usage`` in the config (shared/config.py says why each default is what it is)."""

    weight: float = 0.0
    """KAI's ``kValue``: how much past use moves the division of the surplus (0: not at all)."""
    half_life_s: float = 3600.0
    """Usage halves every this many seconds; 0: no decay (a plain sum over the window)."""
    window_s: float = 604800.0
    """Only use within this many seconds counts."""

    @property
    def bucket_s(self) -> float:
        """The length of one bucket of time."""
        return max(self.window_s / BUCKETS, MIN_BUCKET_S)


class Bucket(msgspec.Struct, array_like=True, frozen=True):
    """What was held during one bucket (resource-seconds per dimension, decayed to the
    bucket's end)."""

    start: float
    held: dict[str, float]


class Stored(msgspec.Struct, frozen=True):
    """One queue's memory as stored (the capacity's too, under :data:`CAPACITY`)."""

    buckets: list[Bucket] = msgspec.field(default_factory=list)
    rate: dict[str, float] = msgspec.field(default_factory=dict)
    """What it held at the last sample (held since then, until the next one)."""
    at: float = 0.0
    """When that sample was taken."""
    half_life_s: float = 0.0
    """The half-life its buckets were decayed with (another's are not taken back)."""


@dataclass(slots=True)
class _Track:
    buckets: dict[int, Resources] = field(default_factory=dict)
    """Resource-seconds by bucket index (``start // bucket_s``), decayed to its end."""
    rate: Resources = field(default_factory=dict)


class UsageMemory:
    """Every queue's decayed usage, from samples of what each holds (see the module)."""

    def __init__(self, params: UsageParams | None = None) -> None:
        self.params = params or UsageParams()
        self._tracks: dict[str, _Track] = {}
        self._at: float | None = None
        """The last sample's time (None: no sample yet)."""
        self.normalized: dict[str, Resources] = {}
        """Each queue's usage over the capacity's, as of the last :meth:`sample`."""
        self.dirty: set[str] = set()
        """Queues (and :data:`CAPACITY`) whose memory changed since :meth:`stored` last
        took them."""

    def sample(self, now: float, held: Mapping[str, Resources], capacity: Resources) -> None:
        """What each queue holds at ``now`` and the cluster's capacity: the time since the
        last sample is counted at what was held then; ``normalized`` is brought up to date."""
        if self._at is not None and now > self._at:
            since = max(self._at, now - self.params.window_s)  # a longer gap counts a window
            for name, track in self._tracks.items():
                if track.rate:
                    self._integrate(track, since, now)
                    self.dirty.add(name)
        if self._at is None or now > self._at:
            self._at = now
        rates: dict[str, Resources] = {n: {} for n in self._tracks.keys() - {CAPACITY}}
        for name, vector in (*held.items(), (CAPACITY, capacity)):
            rates[name] = {d: v for d, v in vector.items() if v > EPS}
        for name, rate in rates.items():
            if name not in self._tracks:
                if not rate:
                    continue
                self._tracks[name] = _Track()
            if self._tracks[name].rate != rate:
                self._tracks[name].rate = rate
                self.dirty.add(name)  # stored: a restart counts its outage at this rate
        self._expire(now)
        self.normalized = self._normalize(now)

    def usage(self, now: float) -> dict[str, Resources]:
        """Each queue's decayed usage (resource-seconds) as of ``now``; the capacity's
        under :data:`CAPACITY`."""
        return {name: self._decayed(track, now) for name, track in self._tracks.items()}

    def _integrate(self, track: _Track, since: float, until: float) -> None:
        """Add ``track.rate`` held from ``since`` to ``until`` into its buckets."""
        size, half = self.params.bucket_s, self.params.half_life_s
        t = since
        while t < until - EPS:
            index = math.floor(t / size)
            if (index + 1) * size <= t + EPS:  # ``t`` on a boundary, rounded below it
                index += 1
            end = (index + 1) * size
            stop = min(until, end)
            if half > 0:  # ∫ 0.5^((end - u) / h) du from t to stop, exactly
                weight = (
                    half / math.log(2) * (0.5 ** ((end - stop) / half) - 0.5 ** ((end - t) / half))
                )
            else:
                weight = stop - t
            accumulate(track.buckets.setdefault(index, {}), track.rate, weight)
            t = stop

    def _expire(self, now: float) -> None:
        """Drop buckets wholly older than the window, and queues with nothing left."""
        size = self.params.bucket_s
        oldest = math.floor((now - self.params.window_s) / size)
        for name in list(self._tracks):
            track = self._tracks[name]
            for index in [i for i in track.buckets if i < oldest]:
                del track.buckets[index]
                self.dirty.add(name)
            if not track.buckets and not track.rate:
                del self._tracks[name]
                self.dirty.add(name)

    def _decayed(self, track: _Track, now: float) -> Resources:
        """Its buckets decayed from their ends to ``now`` (the bucket in progress ends
        after ``now``: its factor is above 1, undoing the decay to an end not reached)."""
        size, half = self.params.bucket_s, self.params.half_life_s
        out: Resources = {}
        for index, held in track.buckets.items():
            factor = 0.5 ** ((now - (index + 1) * size) / half) if half > 0 else 1.0
            accumulate(out, held, factor)
        return out

    def _normalize(self, now: float) -> dict[str, Resources]:
        used = self.usage(now)
        total = used.pop(CAPACITY, {})
        return {
            name: {d: v / total[d] for d, v in vector.items() if total.get(d, 0.0) > EPS}
            for name, vector in used.items()
        }

    # --- storage ----------------------------------------------------------------------

    def stored(self, names: Iterable[str]) -> dict[str, Stored | None]:
        """What to store for each of ``names`` (None: forget it), taken from ``dirty``."""
        size = self.params.bucket_s
        out: dict[str, Stored | None] = {}
        for name in names:
            self.dirty.discard(name)
            track = self._tracks.get(name)
            out[name] = (
                None
                if track is None
                else Stored(
                    buckets=[Bucket(i * size, dict(h)) for i, h in sorted(track.buckets.items())],
                    rate=dict(track.rate),
                    at=self._at or 0.0,
                    half_life_s=self.params.half_life_s,
                )
            )
        return out

    def restore(self, stored: Mapping[str, Stored]) -> None:
        """Take back what was stored (before any sample): the time since it was stored
        counts at the rates it held then (up to a window), at the next sample. Buckets
        decayed with another half-life (the config changed) are not taken back."""
        size = self.params.bucket_s
        for name, entry in stored.items():
            track = self._tracks[name] = _Track(rate=dict(entry.rate))
            if entry.half_life_s != self.params.half_life_s:
                self.dirty.add(name)
                continue
            for b in entry.buckets:
                accumulate(track.buckets.setdefault(math.floor(b.start / size + EPS), {}), b.held)
        ats = [e.at for e in stored.values() if e.at > 0]
        if ats:
            self._at = max(ats)
