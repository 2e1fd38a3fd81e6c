"""Dynamic Resource Allocation, decided by Tessera: which devices of a node's
ResourceSlices a pod's ResourceClaims get, with the semantics of the structured
allocator of the Kubernetes release tools/go.mod pins (docs/dra.md, "How Tessera
decides a claim").

- shared/core/dra/model.py: the records (devices, classes, claims, what is in use, an
  allocation);
- shared/core/dra/read.py: API objects in and out;
- shared/core/dra/cel.py: selectors (CEL with Kubernetes' libraries);
- shared/core/dra/capacity.py: consumable capacity and request policies;
- shared/core/dra/prepare.py: what is decided once per pod;
- shared/core/dra/devices.py: the search's units (requests, devices, constraints, taints);
- shared/core/dra/counters.py: shared counters of partitionable devices;
- shared/core/dra/allocate.py: :func:`prepare` once per pod, :func:`allocate` per node;
- shared/core/dra/written.py: the allocation as the allocator writes it.
- shared/core/dra/binding.py: binding conditions, read before a pod's Binding.
"""

from shared.core.dra.allocate import CANNOT_ALLOCATE, allocate
from shared.core.dra.model import Allocation, Claim, DeviceClass, InUse, Outcome, Pool
from shared.core.dra.prepare import Prepared, prepare

__all__ = [
    "CANNOT_ALLOCATE",
    "Allocation",
    "Claim",
    "DeviceClass",
    "InUse",
    "Outcome",
    "Pool",
    "Prepared",
    "allocate",
    "prepare",
]
