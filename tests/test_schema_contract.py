"""The exported SDL is the code's schema, and it keeps the whole public contract."""

from __future__ import annotations

from pathlib import Path

from graphql import (
    GraphQLArgument,
    GraphQLEnumType,
    GraphQLInputField,
    GraphQLInputObjectType,
    GraphQLInterfaceType,
    GraphQLObjectType,
    GraphQLSchema,
    build_schema,
    print_ast,
)

from schema import schema

ROOT = Path(__file__).resolve().parent.parent
# The first public contract, kept in the repository: names, types and error codes
# there are fixed; the schema may add to it, never rename or remove.
CONTRACT = ROOT / "docs" / "contract.graphql"


def test_exported_sdl_matches_the_code() -> None:
    exported = (ROOT / "schema.graphql").read_text()
    assert exported == schema.as_str() + "\n", "run `python app.py export-schema` and commit schema.graphql"


def default_of(argument: GraphQLArgument | GraphQLInputField) -> str | None:
    """The default as written in the SDL; `= null` on a nullable input is no default."""
    node = argument.ast_node
    if node is None or node.default_value is None:
        return None
    text = print_ast(node.default_value)
    return None if text == "null" else text


def contract_differences(contract: GraphQLSchema, ours: GraphQLSchema) -> list[str]:
    """Every type, field, argument, default and enum value of the contract must be
    in ours with the same type; ours may add, never rename, remove or retype."""
    problems: list[str] = []
    for name, theirs in contract.type_map.items():
        if name.startswith("__"):
            continue
        mine = ours.type_map.get(name)
        if mine is None:
            problems.append(f"missing type {name}")
            continue
        if type(mine) is not type(theirs):
            problems.append(f"{name} is a {type(mine).__name__}, not a {type(theirs).__name__}")
            continue
        if isinstance(theirs, GraphQLEnumType):
            assert isinstance(mine, GraphQLEnumType)
            problems += [f"enum {name} lacks {v}" for v in theirs.values if v not in mine.values]
        elif isinstance(theirs, (GraphQLObjectType, GraphQLInterfaceType)):
            assert isinstance(mine, (GraphQLObjectType, GraphQLInterfaceType))
            for field_name, field in theirs.fields.items():
                ours_field = mine.fields.get(field_name)
                if ours_field is None:
                    problems.append(f"missing field {name}.{field_name}")
                    continue
                if str(ours_field.type) != str(field.type):
                    problems.append(f"{name}.{field_name} is {ours_field.type}, not {field.type}")
                for arg_name, arg in field.args.items():
                    ours_arg = ours_field.args.get(arg_name)
                    if ours_arg is None:
                        problems.append(f"missing argument {name}.{field_name}({arg_name})")
                    elif str(ours_arg.type) != str(arg.type):
                        problems.append(f"{name}.{field_name}({arg_name}) is {ours_arg.type}, not {arg.type}")
                    elif default_of(ours_arg) != default_of(arg):
                        problems.append(
                            f"{name}.{field_name}({arg_name}) defaults to {default_of(ours_arg)}, "
                            f"not {default_of(arg)}"
                        )
                for arg_name, arg in ours_field.args.items():
                    if arg_name not in field.args and str(arg.type).endswith("!") and default_of(arg) is None:
                        problems.append(f"{name}.{field_name}({arg_name}) is a new required argument")
        elif isinstance(theirs, GraphQLInputObjectType):
            assert isinstance(mine, GraphQLInputObjectType)
            for field_name, field in theirs.fields.items():
                ours_field = mine.fields.get(field_name)
                if ours_field is None:
                    problems.append(f"missing input field {name}.{field_name}")
                elif str(ours_field.type) != str(field.type):
                    problems.append(f"{name}.{field_name} is {ours_field.type}, not {field.type}")
                elif default_of(ours_field) != default_of(field):
                    problems.append(f"{name}.{field_name} defaults to {default_of(ours_field)}")
    return problems


def test_the_whole_contract_is_served() -> None:
    contract = build_schema(CONTRACT.read_text())
    ours = build_schema(schema.as_str())
    assert contract_differences(contract, ours) == []


def test_the_check_notices_a_retyped_field() -> None:
    contract = build_schema("type Query { me: String! n(first: Int = 20): Int }")
    assert contract_differences(
        contract, build_schema("type Query { me: String n(first: Int = 20): Int }")
    ) == ["Query.me is String, not String!"]
    assert contract_differences(
        contract, build_schema("type Query { me: String! n(first: Int = 5): Int }")
    ) == ["Query.n(first) defaults to 5, not 20"]


def test_the_graphql_enums_hold_exactly_the_store_enums() -> None:
    from schema import enums as graphql_enums
    from store import enums as store_enums

    pairs = {
        graphql_enums.FamilyRole: store_enums.Role,
        graphql_enums.TrustLevel: store_enums.TrustLevel,
        graphql_enums.ContentType: store_enums.ContentType,
        graphql_enums.ContentStatus: store_enums.ContentStatus,
        graphql_enums.CapsuleStatus: store_enums.CapsuleStatus,
        graphql_enums.NotificationType: store_enums.NotificationType,
        graphql_enums.DataExportStatus: store_enums.ExportStatus,
        graphql_enums.EmailPreference: store_enums.EmailPreference,
        graphql_enums.PushPlatform: store_enums.PushPlatform,
        graphql_enums.PostingPolicy: store_enums.PostingPolicy,
        graphql_enums.FamilyEventType: store_enums.FamilyEventType,
    }
    for graphql_enum, store_enum in pairs.items():
        assert {m.name: m.value for m in graphql_enum} == {m.name: m.value for m in store_enum}
