"""One codec for every record of the table.

A record is a frozen dataclass. Its fields become item attributes under their
camelCase names (`created_at` -> `createdAt`), and come back the same way, with
the dataclass's defaults for attributes an older item lacks. What differs from
record to record is declared on the record, never coded twice:

- `ITEM_TYPE`: the item's `type` attribute (the class name unless set);
- `RENAMED`: fields stored under another name (`type` -> `contentType`);
- `DERIVED`: fields not stored as themselves, but read back from the item by
  `derived_from` (whether an index key is present, say);
- `index_keys()` and `extra_attributes()`: what the item holds besides fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any, ClassVar, Self

from store.port import Item, Key


def attribute_name(field_name: str) -> str:
    head, *rest = field_name.split("_")
    return head + "".join(part.title() for part in rest)


class Record:
    """The codec, mixed into each record dataclass."""

    ITEM_TYPE: ClassVar[str | None] = None
    RENAMED: ClassVar[Mapping[str, str]] = {}
    DERIVED: ClassVar[frozenset[str]] = frozenset()

    @property
    def key(self) -> Key:
        raise NotImplementedError

    def index_keys(self) -> Item:
        """The GSI key attributes this record's item carries now."""
        return {}

    def extra_attributes(self) -> Item:
        """Attributes beside the fields (e.g. one counter per emoji)."""
        return {}

    @classmethod
    def derived_from(cls, item: Item) -> dict[str, Any]:
        """The DERIVED fields, read back from an item."""
        return {}

    @classmethod
    def item_type(cls) -> str:
        return cls.ITEM_TYPE or cls.__name__

    def to_item(self) -> Item:
        pk, sk = self.key
        item: Item = {"PK": pk, "SK": sk, "type": self.item_type()}
        for name, attribute, _ in self._stored_fields():
            value = getattr(self, name)
            item[attribute] = list(value) if isinstance(value, tuple) else value
        item.update(self.extra_attributes())
        item.update(self.index_keys())
        return item

    @classmethod
    def _stored_fields(cls) -> tuple[tuple[str, str, bool], ...]:
        """(field, attribute, whether the field has no default) per stored field:
        worked out once per class, since every read decodes items and every
        write encodes one."""
        found = cls.__dict__.get("_stored")
        if found is None:
            found = tuple(
                (spec.name, cls.RENAMED.get(spec.name, attribute_name(spec.name)), spec.default is MISSING)
                for spec in fields(cls)  # type: ignore[arg-type]
                if spec.name not in cls.DERIVED
            )
            type.__setattr__(cls, "_stored", found)
        return found

    @classmethod
    def from_item(cls, item: Item) -> Self:
        values: dict[str, Any] = {}
        for name, attribute, required in cls._stored_fields():
            if attribute in item:
                value = item[attribute]
                if value is not None or required:
                    values[name] = tuple(value) if isinstance(value, list) else value
        values.update(cls.derived_from(item))
        return cls(**values)
