"""Holds the device ledger and places whole gangs or nothing.

The single writer of the ledger (one active replica): it consumes inventory and gang
events, runs the pure core, reserves what it placed and publishes one decision per pod
or a failure with per-node reasons. On start it rebuilds the ledger from bound pods.
"""
