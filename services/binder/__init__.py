"""Turns a decision into ONE write: a Binding that carries the grant annotations.

Bounded concurrency, no per-node lock; a failed write releases the reservation.
"""
