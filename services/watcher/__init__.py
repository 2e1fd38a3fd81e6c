"""The only service that lists and watches the API server.

It turns pods of our schedulers, nodes, PodGroups and Queues into small typed events
with the request already parsed and validated by the core; an invalid request becomes a
Kubernetes Event and a pod condition, never a crash.
"""
