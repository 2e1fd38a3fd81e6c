"""Which API verbs each Tessera ServiceAccount used, from an API server audit log.

``TESSERA_API_AUDIT=/tmp/audit.log make test`` (tests/conftest.py) logs every request
the services make under their own accounts; ``python -m tools.rbac_audit
/tmp/audit.log`` prints, per account, each (verb, resource) it was allowed and each it
was refused. Compare with deploy/kustomize/base/rbac.yaml: a rule no test used is a
candidate for removal, a refusal a missing rule.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def summary(path: Path) -> dict[str, dict[str, set[str]]]:
    """account -> {"allowed": {"verb resource[/sub]"}, "refused": {...}}."""
    out: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        user = entry.get("user", {}).get("username", "")
        ref = entry.get("objectRef") or {}
        resource = ref.get("resource", entry.get("requestURI", ""))
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        if ref.get("apiGroup"):
            resource = f"{ref['apiGroup']}:{resource}"
        code = (entry.get("responseStatus") or {}).get("code", 0)
        kind = "refused" if code == 403 else "allowed"
        out[user.removeprefix("system:serviceaccount:")][kind].add(f"{entry['verb']} {resource}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("log", type=Path)
    args = parser.parse_args()
    for account, kinds in sorted(summary(args.log).items()):
        print(account)
        for kind in ("allowed", "refused"):
            for item in sorted(kinds.get(kind, ())):
                print(f"  {kind:<8} {item}")


if __name__ == "__main__":
    main()
