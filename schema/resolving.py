"""Our resolvers called the way graphql-core calls its own.

Strawberry puts every field that has a resolver behind a wrapper: it builds an
`Info`, converts the arguments by their Strawberry types, runs the field's
extensions and exception handlers, and (for an async resolver) awaits the
result in a coroutine of its own. For most of our fields none of that does
anything: `Content.commentCount` reads `self.item.comment_count`, `Content.author`
awaits a loader. On a feed of 20 those wrappers are several hundred calls per
execution, the largest part of what Strawberry adds to graphql-core
(bench/ section 1).

`call_directly` gives such fields a resolver that calls ours with what the
wrapper would have passed (the source as `self`, an `Info` only when the
resolver names one, the arguments under their Python names). A field keeps
Strawberry's wrapper when anything in it could act: field extensions (and so
permission classes), exception handlers, or an argument whose value Strawberry
converts (input objects, enums, lists). The read rule does not live in
resolvers (schema.guard), so no field can skip it this way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import strawberry
from graphql import GraphQLNonNull, GraphQLObjectType, GraphQLScalarType, GraphQLType

from schema.strawberry_internals import (
    StrawberryField,
    core_schema,
    has_exception_handlers,
    info_maker,
    strawberry_field,
)


def _plain_scalar(type_: GraphQLType) -> bool:
    """A scalar argument, which Strawberry passes on as graphql-core parsed it."""
    if isinstance(type_, GraphQLNonNull):
        type_ = type_.of_type
    return isinstance(type_, GraphQLScalarType)


def _direct(schema: strawberry.Schema, field: StrawberryField, graphql_args: dict[str, Any]) -> Any | None:
    resolver = field.base_resolver
    if resolver is None or field.extensions or field.permission_classes:
        return None
    if has_exception_handlers(schema, field):
        return None
    if resolver.parent_parameter is not None or resolver.root_parameter is not None:
        return None
    if not all(_plain_scalar(argument.type) for argument in graphql_args.values()):
        return None
    graphql_name = schema.config.name_converter.from_argument
    names = {graphql_name(argument): argument.python_name for argument in field.arguments}
    if set(names) != set(graphql_args):
        return None
    call: Callable[..., Any] = resolver.wrapped_func  # type: ignore[assignment]  # a function here
    takes_self = resolver.self_parameter is not None
    info_name = resolver.info_parameter.name if resolver.info_parameter is not None else None
    make_info = info_maker(schema, field)
    renamed = {graphql: python for graphql, python in names.items() if graphql != python}

    if info_name is None and not graphql_args and takes_self:

        def read(source: Any, info: Any) -> Any:
            return call(source)

        return read

    def resolve(source: Any, info: Any, **kwargs: Any) -> Any:
        if renamed:
            kwargs = {renamed.get(name, name): value for name, value in kwargs.items()}
        if info_name is not None:
            kwargs[info_name] = make_info(info)
        return call(source, **kwargs) if takes_self else call(**kwargs)

    return resolve


def call_directly(schema: strawberry.Schema) -> int:
    """Gives every field it can a direct resolver; returns how many it changed."""
    changed = 0
    graphql_schema = core_schema(schema)
    skipped = {graphql_schema.subscription_type}  # a subscription's root fields subscribe
    for type_ in graphql_schema.type_map.values():
        if not isinstance(type_, GraphQLObjectType) or type_ in skipped or type_.name.startswith("__"):
            continue
        for graphql_field in type_.fields.values():
            field = strawberry_field(graphql_field)
            if field is None:
                continue
            resolve = _direct(schema, field, dict(graphql_field.args))
            if resolve is not None:
                graphql_field.resolve = resolve
                changed += 1
    return changed
