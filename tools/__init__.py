"""Developer tooling: the local control plane (tools/localcluster.py) and its Go build."""
