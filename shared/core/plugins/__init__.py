"""The scheduling cycle's plugins, one per module (shared/core/framework.py finds them
here by their ``name``). kube-scheduler's filters and scores keep its names, order,
reasons and formulas; bench/parity.py compares them with the pinned release's own."""
