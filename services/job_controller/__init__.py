"""The Volcano Job controller: a Job's PodGroup, its pods per task replica, its status.

Its pods go through the scheduler like any other; only the objects are made here.

- service.py: the service (the Job events it handles, the watch of the Jobs' pods);
- runner.py: each Job's requests under one lock, the actions carried out, retries, TTL;
- policies.py, lifecycle.py, status.py: pure: which action answers an event, what it
  does in each phase, the status it writes (delayed.py: the actions waiting);
- podview.py, pods.py: the pods as read back, and as made from the task template;
- plugins/: the Job plugins; made.py, podgroup.py, resources.py: the other objects;
- api.py, tracked.py, timers.py: the API calls, a Job as known, the timers.
"""
