"""A fuzz suite generated from the schema, against a running server.

hypothesis-graphql writes valid queries and mutations of our schema, with
random arguments; a second strategy breaks them (cut, spliced, with stray
characters) and sends malformed bodies. Whatever arrives, the server answers
with no 5xx, logs no traceback, and keeps answering `/healthz`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_graphql import nodes
from hypothesis_graphql import strategies as gql_strategies

from resolvers.core.auth import mint_token
from schema import schema
from schema.strawberry_internals import core_schema
from tests.servers import SECRET, ServerProcess

SDL = schema.as_str()
# Dates as a client sends them, with and without a zone, and text that is not one.
SCALARS = {
    "DateTime": (st.datetimes().map(lambda d: d.isoformat()) | st.text(max_size=30)).map(nodes.String),
}
OPERATIONS = gql_strategies.queries(SDL, custom_scalars=SCALARS) | gql_strategies.mutations(
    SDL, custom_scalars=SCALARS
)
TOKEN = mint_token(SECRET, "fuzzer", given_name="Fuzz")


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,  # the same few thousand cases on every run, so a failure reproduces
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.data_too_large,
        ],
    )


@pytest.fixture(scope="module")
def client(live_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.url, timeout=30) as session:
        # The fuzzer is a member of a family, so some generated ids could matter.
        session.post(
            "/graphql",
            json={"query": 'mutation { createFamily(input: {name: "Fuzz"}) { id } }'},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        yield session


def check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text[:500]
    if response.headers.get("content-type", "").startswith("application/json"):
        body = response.json()
        assert isinstance(body, dict), body
        for error in body.get("errors") or []:
            assert error.get("extensions", {}).get("code"), error
            assert error["extensions"]["code"] != "INTERNAL_SERVER_ERROR", error


def assert_healthy(client: httpx.Client, server: ServerProcess) -> None:
    assert client.get("/healthz").status_code == 200
    log = server.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


@fuzz_settings(1500)
@given(
    query=OPERATIONS,
    signed_in=st.booleans(),
)
def test_generated_operations_never_fail_the_server(
    client: httpx.Client, live_server: ServerProcess, query: str, signed_in: bool
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"} if signed_in else {}
    check(client.post("/graphql", json={"query": query}, headers=headers))


@fuzz_settings(1000)
@given(
    query=OPERATIONS,
    cut=st.integers(min_value=0, max_value=400),
    noise=st.text(alphabet=st.sampled_from('{}()[]:$!@#"\\ \n\x00abcXYZ0123'), max_size=12),
    variables=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
        max_leaves=12,
    ),
    shape=st.sampled_from(["query", "raw", "variables"]),
)
def test_broken_operations_and_bodies_get_clean_refusals(
    client: httpx.Client,
    live_server: ServerProcess,
    query: str,
    cut: int,
    noise: str,
    variables: object,
    shape: str,
) -> None:
    broken = query[:cut] + noise + query[cut:]
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    if shape == "query":
        body = json.dumps({"query": broken})
    elif shape == "variables":
        body = json.dumps({"query": query, "variables": variables})
    else:
        body = broken  # not JSON at all, or JSON of the wrong shape
    check(client.post("/graphql", content=body.encode("utf-8", "surrogatepass"), headers=headers))


def test_the_server_is_healthy_after_the_fuzz(client: httpx.Client, live_server: ServerProcess) -> None:
    """Runs after the fuzz tests of this module (pytest keeps file order)."""
    assert_healthy(client, live_server)


# Sizes sent every way a client can --------------------------------------------------------
#
# For every list argument of the schema (`first`), the size goes as a literal,
# as a float variable, as a declared default not sent, as null, and not at all.
# Whatever form it takes, the cost the server estimates is the one of the size
# execution sees: the literal's. A server with a small cost limit makes that
# visible: pages over a few dozen are refused, with their estimate.

TIGHT_COST = 60
LEAF_VALUES = {"ID": '"x"', "String": '"x"', "Int": "1", "Boolean": "true"}


def _sized_fields() -> list[tuple[str, str, str, str]]:
    """(name, path opening, path closing, the field's other arguments) for every field with a `first`
    argument that a query reaches, by the shortest path from Query; required
    arguments along the way are literals."""
    from graphql import GraphQLObjectType, Undefined, get_named_type, is_non_null_type

    graphql_schema = core_schema(schema)
    assert graphql_schema.query_type is not None
    paths: dict[str, tuple[str, str]] = {graphql_schema.query_type.name: ("", "")}
    queue = [graphql_schema.query_type]
    found: list[tuple[str, str, str, str]] = []
    while queue:
        parent = queue.pop(0)
        opening, closing = paths[parent.name]
        for name, field in parent.fields.items():
            inner = get_named_type(field.type)
            if not isinstance(inner, GraphQLObjectType):
                continue
            required = {
                a: arg
                for a, arg in field.args.items()
                if is_non_null_type(arg.type) and arg.default_value is Undefined
            }
            if any(get_named_type(arg.type).name not in LEAF_VALUES for arg in required.values()):
                continue
            literals = ", ".join(
                f"{a}: {LEAF_VALUES[get_named_type(arg.type).name]}" for a, arg in required.items()
            )
            if "first" in field.args:
                found.append((f"{parent.name}.{name}", opening, closing, literals))
            if inner.name not in paths:
                call = f"{name}({literals})" if literals else name
                paths[inner.name] = (f"{opening}{call} {{ ", f" }}{closing}")
                queue.append(inner)
    return found


SIZED = _sized_fields()


def _sized_query(sized: tuple[str, str, str, str], size: str, declared: str | None) -> str:
    from graphql import GraphQLObjectType, get_named_type

    field, opening, closing, literals = sized
    parent, name = field.split(".")
    target = core_schema(schema).type_map[parent]
    assert isinstance(target, GraphQLObjectType)
    inner = get_named_type(target.fields[name].type)
    assert isinstance(inner, GraphQLObjectType)
    selection = "edges { __typename }" if "edges" in inner.fields else "__typename"
    arguments = ", ".join(a for a in (literals, f"first: {size}" if size else "") if a)
    argument = f"({arguments})" if arguments else ""
    head = f"query({declared}) " if declared else "query "
    return f"{head}{{ {opening}{name}{argument} {{ {selection} }}{closing} }}"


def _cost(response: httpx.Response) -> object:
    check(response)
    errors = response.json().get("errors") or []
    return next((e["extensions"]["cost"] for e in errors if "cost" in e.get("extensions", {})), None)


def test_every_list_argument_is_reached() -> None:
    """The generated paths reach every list argument of the schema's queries."""
    names = {sized[0] for sized in SIZED}
    assert {
        "Family.feed",
        "Family.members",
        "Content.comments",
        "Capsule.recipients",
        "Query.notifications",
    } <= names


@pytest.fixture(scope="module")
def tight_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tmp_path_factory.mktemp("tight"),
        {"MIFAMILIAS_AUTH_SECRET": SECRET, "MIFAMILIAS_MAX_QUERY_COST": str(TIGHT_COST)},
    ).start()
    try:
        yield server
    finally:
        server.stop()


@fuzz_settings(300)
@given(
    sized=st.sampled_from(SIZED),
    size=st.integers(min_value=-3, max_value=250),
    form=st.sampled_from(["float", "default", "default-and-sent-null", "omitted", "null"]),
)
def test_sizes_in_every_form_are_estimated_as_execution_reads_them(
    tight_server: ServerProcess, sized: tuple[str, str, str, str], size: int, form: str
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=tight_server.url, timeout=30, headers=headers) as session:

        def post(query: str, variables: dict[str, object] | None = None) -> object:
            return _cost(session.post("/graphql", json={"query": query, "variables": variables or {}}))

        if form == "float":
            sent = post(_sized_query(sized, "$n", "$n: Int"), {"n": float(size)})
            expected = post(_sized_query(sized, str(size), None))
        elif form in ("default", "default-and-sent-null"):
            query = _sized_query(sized, "$n", f"$n: Int = {size}")
            sent = post(query, {"n": None} if form == "default-and-sent-null" else None)
            # A null sent overrides the default: the field's own default runs.
            literal = "null" if form == "default-and-sent-null" else str(size)
            expected = post(_sized_query(sized, literal, None))
        elif form == "omitted":
            sent = post(_sized_query(sized, "$n", "$n: Int"))
            expected = post(_sized_query(sized, "", None))
        else:
            sent = post(_sized_query(sized, "$n", "$n: Int"), {"n": None})
            expected = post(_sized_query(sized, "null", None))
        assert sent == expected, (sized[0], form, size)


@fuzz_settings(100)
@given(sized=st.sampled_from(SIZED), size=st.floats(allow_nan=True, allow_infinity=True))
def test_sizes_that_are_not_whole_numbers_get_clean_refusals(
    tight_server: ServerProcess, sized: tuple[str, str, str, str], size: float
) -> None:
    query = _sized_query(sized, "$n", "$n: Int")
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    body = json.dumps({"query": query, "variables": {"n": size}})
    with httpx.Client(base_url=tight_server.url, timeout=30, headers=headers) as session:
        response = session.post("/graphql", content=body)
        cost = _cost(response)
        if (
            size != size
            or size in (float("inf"), float("-inf"))
            or not size.is_integer()
            or abs(size) > 2**31
        ):
            # Not an Int: refused by coercion, before any estimate or store call.
            assert cost is None and response.json()["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"


def test_the_tight_server_is_healthy_after_the_fuzz(tight_server: ServerProcess) -> None:
    with httpx.Client(base_url=tight_server.url, timeout=30) as session:
        assert_healthy(session, tight_server)
