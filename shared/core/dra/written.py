"""A claim's allocation as the allocator writes it: the device results, the class and
claim configuration per request, and the node selector (shared/core/dra/allocate.py
calls :func:`allocation` once the search has chosen)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from shared.core.dra.devices import Dev, Req
from shared.core.dra.model import Allocation, Claim, DeviceResult


class SelectorTermsError(Exception):
    """A slice's node selector has several terms: no one selector can be written."""


def allocation(
    claim: Claim,
    node: str,
    chosen: Sequence[tuple[Req, Dev, Mapping[str, Fraction] | None]],
    picked: Sequence[Req],
) -> Allocation:
    """A claim's ``status.allocation`` from the search's choices: ``chosen`` the devices
    in the order they were added, ``picked`` per request the (sub)request served.
    Raises SelectorTermsError when a slice's node selector has several terms."""
    results = []
    for req, dev, amounts in chosen:
        results.append(
            DeviceResult(
                request=req.result_name,
                driver=dev.key[0],
                pool=dev.key[1],
                device=dev.key[2],
                admin_access=True if req.request.admin_access else None,
                tolerations=req.request.tolerations,
                share=dev.device.shared,
                consumed=amounts or None,
                binding_conditions=dev.device.binding_conditions,
                binding_failure_conditions=dev.device.binding_failure_conditions,
            )
        )
    config: list[tuple[str, tuple[str, ...], object]] = []
    by_class: dict[str, list[int]] = {}
    for req in picked:
        if req.cls.name in by_class:
            for i in by_class[req.cls.name]:
                source, names, entry = config[i]
                config[i] = (source, (*names, req.result_name), entry)
            continue
        by_class[req.cls.name] = []
        for entry in req.cls.config:
            by_class[req.cls.name].append(len(config))
            config.append(("FromClass", (req.result_name,), entry))
    for names, entry in claim.config:
        if not names:
            config.append(("FromClaim", names, entry))
            continue
        for r, request in enumerate(claim.requests):
            served = picked[r]
            if request.name in names or (served.parent and served.result_name in names):
                config.append(("FromClaim", names, entry))
    selector = _node_selector(node, claim, [dev for _, dev, _ in chosen])
    return Allocation(results=tuple(results), config=tuple(config), node_selector=selector)


def _node_selector(node: str, claim: Claim, devices: list[Dev]) -> dict[str, Any] | None:
    """The allocation's node selector, as the allocator makes it: the node itself at the
    first device of a node's own slice (or one that binds to the node); else the
    requirements of the slices' one-term node selectors, each once."""
    fields: list[Mapping[str, Any]] = []
    expressions: list[Mapping[str, Any]] = []
    for dev in devices:
        where = dev.device if dev.slice.per_device else dev.slice
        if where.node_name or dev.device.binds_to_node:
            pin = {"key": "metadata.name", "operator": "In", "values": [node]}
            return {"nodeSelectorTerms": [{"matchFields": [pin]}]}
        terms = (where.node_selector or {}).get("nodeSelectorTerms") or []
        if len(terms) > 1:
            raise SelectorTermsError(
                f"create NodeSelector for claim {claim.name}: unsupported "
                f"ResourceSlice.NodeSelector with {len(terms)} terms"
            )
        for one in terms:
            _merge(one.get("matchFields") or (), fields)
            _merge(one.get("matchExpressions") or (), expressions)
    if not fields and not expressions:
        return None
    term: dict[str, Any] = {}
    if expressions:
        term["matchExpressions"] = expressions
    if fields:
        term["matchFields"] = fields
    return {"nodeSelectorTerms": [term]}


def _merge(new: Sequence[Mapping[str, Any]], into: list[Mapping[str, Any]]) -> None:
    """Adds the requirements ``into`` lacks (same key, operator and set of values)."""
    for requirement in new:
        values = set(requirement.get("values") or ())
        if not any(
            r.get("key") == requirement.get("key")
            and r.get("operator") == requirement.get("operator")
            and set(r.get("values") or ()) == values
            for r in into
        ):
            into.append(requirement)
