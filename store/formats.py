"""Which format an item was written in.

Both engines stamp every item they put or update with `fmt`, the format of the
code that wrote it last, so no write path (a record through the codec, a raw
`Update` of a lease, a transaction, a batch) can leave it out. An item without
it was last written by a release before formats were recorded: format 1.

What changed from one format to the next, and what the code still reads of the
previous one for a release (docs/decisions.md, "Items carry their format"):

- 1: the mailer leased a note under names of its own (`mailLeaseUntil`,
  `mailOwner`, `mailAttempts`) and the exports counted their claims in
  `attempts`;
- 2: every lease is `leaseUntil`, `leaseOwner` and `leaseAttempts`
  (`resolvers.core.leases`), which reads format 1's names too.
"""

from __future__ import annotations

from dataclasses import replace

from store.port import Item, Update

ATTRIBUTE = "fmt"
CURRENT = 2
# What an item that does not say is: written before formats were recorded.
UNRECORDED = 1


def stamped(item: Item) -> Item:
    """The item as an engine writes it: in the current format."""
    return {**item, ATTRIBUTE: CURRENT}


def stamped_update(update: Update) -> Update:
    """The update as an engine applies it: the item it leaves is in the
    current format, whatever it set."""
    return replace(
        update,
        set={**update.set, ATTRIBUTE: CURRENT},
        remove=[name for name in update.remove if name != ATTRIBUTE],
        add={name: delta for name, delta in update.add.items() if name != ATTRIBUTE},
    )


def format_of(item: Item) -> int:
    found = item.get(ATTRIBUTE)
    return found if isinstance(found, int) and not isinstance(found, bool) else UNRECORDED
