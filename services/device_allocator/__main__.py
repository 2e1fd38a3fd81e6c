"""``python -m services.device_allocator [--shard NAME]``: run the device-allocator."""

import argparse

from services.device_allocator.service import SHARD_ENV, Allocator
from shared.runtime import main_entry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--shard NAME``: the shard of ``scheduler.shards`` this allocator places."""
    parser.add_argument(
        "--shard",
        metavar="NAME",
        help=f"the shard of scheduler.shards this allocator places (default: ${SHARD_ENV}; "
        "docs/sharding.md)",
    )


if __name__ == "__main__":
    main_entry(Allocator, add_arguments=add_arguments)
