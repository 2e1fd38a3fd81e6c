"""Groups pending pods by PodGroup and hands a gang to the allocator.

A lone pod is a gang of one. Gangs are ordered by queue fair share and priority and
forwarded once ``minMember`` pods are pending; the coordinator owns PodGroup status and
runs the Volcano Job controller (jobs.py).
"""
