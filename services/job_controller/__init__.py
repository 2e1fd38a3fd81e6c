"""The Volcano Job controller: a Job's PodGroup, its pods per task replica, its status.

Its pods go through the scheduler like any other; only the objects are made here.
"""
