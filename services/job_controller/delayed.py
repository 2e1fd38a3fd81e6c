"""The policy actions waiting for their timeout (Volcano's delayed actions): one per pod
of a Job (or one per Job for a Job-level event), cancelled when the pod moves on or
when an action of their scope runs first. Pure bookkeeping: the timers are
services/job_controller/timers.py's, the actions services/job_controller/runner.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.job_controller.policies import Decision, Request, scope
from services.job_controller.tracked import JobKey

Slot = tuple[JobKey, str]
"""A Job and one of its pods ('' for the Job itself)."""


@dataclass(frozen=True)
class Delayed:
    """A policy action waiting for its timeout (Volcano's delayed actions)."""

    job: JobKey
    decision: Decision

    @property
    def slot(self) -> Slot:
        """One delayed action per pod (or per Job for a Job-level event)."""
        return (self.job, self.decision.pod)


class DelayedActions:
    """The actions waiting, at most one per slot."""

    def __init__(self) -> None:
        self.waiting: dict[Slot, Delayed] = {}

    def add(self, waiting: Delayed) -> bool:
        """Wait with ``waiting``; False when the same action waits in its slot already
        (it keeps its time)."""
        earlier = self.waiting.get(waiting.slot)
        if earlier is not None and earlier.decision.action == waiting.decision.action:
            return False
        self.waiting[waiting.slot] = waiting
        return True

    def take(self, waiting: Delayed) -> bool:
        """Its time came: True, and it waits no more, unless it was cancelled."""
        if self.waiting.get(waiting.slot) is not waiting:
            return False
        del self.waiting[waiting.slot]
        return True

    def forget(self, job: JobKey) -> None:
        """The Job is gone: none of its actions runs."""
        for slot in [s for s in self.waiting if s[0] == job]:
            del self.waiting[slot]

    def cancel_for_pod(self, job: JobKey, req: Request) -> None:
        """A pod that moved on cancels what waited on it (Volcano's
        CleanPodDelayActionsIfNeed): running, failing or going cancels its PodPending
        timeout; running again cancels a PodFailed or PodEvicted one."""
        waiting = self.waiting.get((job, req.pod))
        if waiting is None or req.event not in ("PodRunning", "PodFailed", "PodEvicted"):
            return
        event = waiting.decision.event
        if (event == "PodPending" and waiting.decision.pod_uid == req.pod_uid) or (
            event in ("PodFailed", "PodEvicted") and req.event == "PodRunning"
        ):
            del self.waiting[(job, req.pod)]

    def cancel_scope(self, job: JobKey, decision: Decision) -> None:
        """An action that ran cancels the delayed actions of its scope: every Job-level
        one, a task's for its task, a pod's for its pod."""
        ran = scope(decision.action)
        for slot, waiting in list(self.waiting.items()):
            other = waiting.decision
            if slot[0] != job or scope(other.action) != ran:
                continue
            if ran == "task" and other.task != decision.task:
                continue
            if ran in ("pod", "partition") and other.pod != decision.pod:
                continue
            del self.waiting[slot]
