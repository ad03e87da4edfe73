"""schema.resolving: fields whose Strawberry wrapper would only pass the call
through get graphql-core a direct resolver, answering as Strawberry would;
fields where the wrapper acts keep it."""

from __future__ import annotations

import enum
from typing import Any

import strawberry
from graphql import GraphQLObjectType
from strawberry.extensions import FieldExtension
from strawberry.types import Info

from schema import schema as our_schema
from schema.resolving import call_directly
from schema.strawberry_internals import core_schema


@strawberry.enum
class Mood(enum.Enum):
    HAPPY = "HAPPY"
    SAD = "SAD"


class Shout(FieldExtension):
    def resolve(self, next_: Any, source: Any, info: Any, **kwargs: Any) -> Any:
        return str(next_(source, info, **kwargs)).upper()


@strawberry.type
class Thing:
    name_text: strawberry.Private[str]

    @strawberry.field
    def name(self) -> str:
        return self.name_text

    @strawberry.field
    async def greeting(self, info: Info, to_whom: str, times: int = 2) -> str:
        return f"{info.context['greeting']} {to_whom}" * times

    @strawberry.field(extensions=[Shout()])  # type: ignore[untyped-decorator]
    def loud(self) -> str:
        return self.name_text

    @strawberry.field
    def felt(self, mood: Mood) -> str:
        return f"{self.name_text} is {mood.value.lower()}" if isinstance(mood, Mood) else "not converted"


@strawberry.type
class Query:
    @strawberry.field
    def thing(self) -> Thing:
        return Thing(name_text="ana")


QUERY = '{ thing { name greeting(toWhom: "ben") loud felt(mood: HAPPY) } }'
ANSWER = {"thing": {"name": "ana", "greeting": "hola benhola ben", "loud": "ANA", "felt": "ana is happy"}}


async def test_direct_fields_answer_as_strawberry_does() -> None:
    wrapped = strawberry.Schema(query=Query)
    direct = strawberry.Schema(query=Query)
    assert call_directly(direct) == 3  # Query.thing, Thing.name, Thing.greeting
    for built in (wrapped, direct):
        result = await built.execute(QUERY, context_value={"greeting": "hola"})
        assert result.errors is None and result.data == ANSWER


def test_fields_whose_wrapper_acts_keep_it() -> None:
    direct = strawberry.Schema(query=Query)
    call_directly(direct)
    thing = core_schema(direct).type_map["Thing"]
    assert isinstance(thing, GraphQLObjectType)
    # An extension, an enum argument (Strawberry converts it): Strawberry's own.
    assert thing.fields["loud"].resolve.__module__.startswith("strawberry")
    assert thing.fields["felt"].resolve.__module__.startswith("strawberry")
    assert thing.fields["name"].resolve.__module__ == "schema.resolving"


def test_the_served_schema_resolves_its_record_fields_directly() -> None:
    content = core_schema(our_schema).type_map["Content"]
    assert isinstance(content, GraphQLObjectType)
    for name in ("id", "title", "commentCount", "author", "comments"):
        assert content.fields[name].resolve.__module__ == "schema.resolving", name
