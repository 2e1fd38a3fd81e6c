"""The node agent as a DRA driver (``deviceApi: dra``, docs/dra.md): the kubelet's DRA and
plugin-registration APIs (api.proto, registration.proto and their generated messages,
``make proto``), the node's ResourceSlice (slices.py), the CDI spec of a prepared claim
(cdi.py) and the plugin the kubelet talks to (plugin.py)."""
