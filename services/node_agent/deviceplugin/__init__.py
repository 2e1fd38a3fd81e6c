"""The kubelet device-plugin API (v1beta1, gRPC over unix sockets): api.proto, its
generated messages (``make proto``), and the server the node agent runs (server.py; its
Allocate: allocation.py)."""
