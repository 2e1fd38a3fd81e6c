"""Runs on each node: inventory (NVML, Ascend DCMI or simulated), the kubelet
device-plugin API, and the isolation library's configuration for each container.
"""
