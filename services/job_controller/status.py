"""A Volcano Job's ``status`` as Volcano writes it: :class:`Status` (its phase,
conditions, pod counts per phase and task, ``version``, ``retryCount``,
``controlledResources``), read back from the API object, and the merge patch that
writes only what changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

TTL_PHASES = frozenset({"Completed", "Failed", "Terminated"})
"""Phases ``ttlSecondsAfterFinished`` counts from, as Volcano's garbage collector."""
INVALID = "InvalidJob"
"""``state.reason`` of a Job that breaks Volcano's rules: never acted on."""


@dataclass(frozen=True)
class Status:
    """A Job's status as Volcano writes it (``status`` of the Job)."""

    phase: str = ""
    reason: str = ""
    message: str = ""
    since: str = ""
    """``state.lastTransitionTime``: when it entered ``phase``."""
    min_available: int = 0
    pending: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    terminating: int = 0
    unknown: int = 0
    version: int = 0
    retry_count: int = 0
    tasks: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """``taskStatusCount``: per task, its pods by phase."""
    conditions: tuple[Mapping[str, str], ...] = ()
    """One per phase the Job has been in, the latest last (Volcano keeps one per phase)."""
    controlled: Mapping[str, str] = field(default_factory=dict)
    """``controlledResources``: what the controller made for it (``plugin-ssh``...)."""

    @property
    def alive(self) -> int:
        """Its pods not finished: terminating, pending or running."""
        return self.terminating + self.pending + self.running

    def entered(self, phase: str, now: str, reason: str = "", message: str = "") -> Status:
        """The status once the Job enters ``phase`` at ``now``."""
        condition = {"status": phase, "lastTransitionTime": now}
        if reason:
            condition |= {"reason": reason, "message": message}
        kept = tuple(c for c in self.conditions if c.get("status") != phase)
        return replace(
            self,
            phase=phase,
            reason=reason,
            message=message,
            since=now,
            conditions=(*kept, condition),
        )

    def to_api(self) -> dict[str, Any]:
        """The ``status`` object (counts of 0 left out, as Volcano's omitempty)."""
        state: dict[str, Any] = {"phase": self.phase}
        if self.reason:
            state |= {"reason": self.reason, "message": self.message}
        if self.since:
            state["lastTransitionTime"] = self.since
        out: dict[str, Any] = {"state": state}
        counts = {
            "minAvailable": self.min_available,
            "pending": self.pending,
            "running": self.running,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "terminating": self.terminating,
            "unknown": self.unknown,
            "version": self.version,
            "retryCount": self.retry_count,
        }
        out |= {k: v for k, v in counts.items() if v}
        if self.tasks:
            out["taskStatusCount"] = {t: {"phase": dict(c)} for t, c in self.tasks.items()}
        if self.conditions:
            out["conditions"] = [dict(c) for c in self.conditions]
        if self.controlled:
            out["controlledResources"] = dict(self.controlled)
        return out


def read_status(raw: Mapping[str, Any] | None) -> Status:
    """A Job's ``status`` as written (by Volcano or by Tessera)."""
    raw = raw or {}
    state = raw.get("state") or {}

    def count(key: str) -> int:
        value = raw.get(key, 0)
        return value if isinstance(value, int) else 0

    tasks = {
        str(t): {str(p): int(n) for p, n in ((c or {}).get("phase") or {}).items() if n}
        for t, c in (raw.get("taskStatusCount") or {}).items()
    }
    return Status(
        phase=str(state.get("phase") or ""),
        reason=str(state.get("reason") or ""),
        message=str(state.get("message") or ""),
        since=str(state.get("lastTransitionTime") or ""),
        min_available=count("minAvailable"),
        pending=count("pending"),
        running=count("running"),
        succeeded=count("succeeded"),
        failed=count("failed"),
        terminating=count("terminating"),
        unknown=count("unknown"),
        version=count("version"),
        retry_count=count("retryCount"),
        tasks=tasks,
        conditions=tuple(dict(c) for c in raw.get("conditions") or () if isinstance(c, dict)),
        controlled={str(k): str(v) for k, v in (raw.get("controlledResources") or {}).items()},
    )


def merge_patch(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: keys gone are
    written as null (a count back to 0, a task's phase no pod is in any more)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = merge_patch(old[key], value)
    return patch
