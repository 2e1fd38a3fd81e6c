"""Decides which gangs go to the allocator and when; writes PodGroup status.

A lone pod is a gang of one. The decisions (readiness, queue fair share, order, retries,
victims) are shared/core/gangs.py's; this package is their shell.
"""
