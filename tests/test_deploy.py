"""deploy/: the CloudFormation template passes cfn-lint and declares the very
table `python app.py create-table` makes; the image recipe copies what exists
and its health check answers from /healthz. Nothing is deployed or built here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest
from cfnlint.api import ManualArgs, lint_file
from cfnlint.decode import decode

from resolvers.core.config import ConfigError, Settings
from tests.servers import ROOT, ServerProcess, free_port

TEMPLATE = ROOT / "deploy" / "cloudformation.yaml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def _template() -> Any:
    template, problems = decode(TEMPLATE)
    assert not problems, problems
    return template


def test_the_template_passes_cfn_lint() -> None:
    # Informational checks too (stateful resources say what happens on delete).
    matches = lint_file(TEMPLATE, config=ManualArgs(include_checks=["I"], regions=["us-east-1", "eu-west-1"]))
    assert matches == [], "\n".join(str(match) for match in matches)


def _shape(table: dict[str, Any], billing_mode: str, ttl: dict[str, Any]) -> dict[str, Any]:
    """What makes two tables the same to our code: keys, attribute types,
    indexes with their keys and projections, billing, and the TTL attribute."""
    return {
        "KeySchema": table["KeySchema"],
        "AttributeDefinitions": sorted(table["AttributeDefinitions"], key=lambda a: a["AttributeName"]),
        "GlobalSecondaryIndexes": sorted(
            (
                {"IndexName": i["IndexName"], "KeySchema": i["KeySchema"], "Projection": i["Projection"]}
                for i in table.get("GlobalSecondaryIndexes", [])
            ),
            key=lambda i: i["IndexName"],
        ),
        "LocalSecondaryIndexes": table.get("LocalSecondaryIndexes", []),
        "BillingMode": billing_mode,
        "TimeToLive": ttl,
    }


def test_the_templates_table_is_the_one_create_table_makes(moto_server: str, tmp_path: Path) -> None:
    template = _template()
    declared = template["Resources"]["Table"]["Properties"]
    # The stack's table name defaults to the server's.
    assert declared["TableName"] == {"Ref": "TableName"}
    assert template["Parameters"]["TableName"]["Default"] == Settings().table_name
    assert declared["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}

    name = f"deploy-{uuid.uuid4().hex[:8]}"
    created = subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "create-table"],
        cwd=ROOT,
        env={
            **os.environ,
            "MIFAMILIAS_DATA_DIR": str(tmp_path),
            "MIFAMILIAS_DYNAMODB_ENDPOINT": moto_server,
            "MIFAMILIAS_AWS_REGION": "us-east-1",
            "MIFAMILIAS_TABLE_NAME": name,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert created.returncode == 0 and "created" in created.stdout, created.stderr
    client = boto3.client("dynamodb", endpoint_url=moto_server, region_name="us-east-1")
    try:
        table = client.describe_table(TableName=name)["Table"]
        ttl = client.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
    finally:
        client.delete_table(TableName=name)
    made = _shape(
        table,
        table.get("BillingModeSummary", {}).get("BillingMode", "PROVISIONED"),
        {"AttributeName": ttl.get("AttributeName"), "Enabled": ttl.get("TimeToLiveStatus") == "ENABLED"},
    )
    assert _shape(declared, declared["BillingMode"], declared["TimeToLiveSpecification"]) == made


def test_the_service_is_probed_and_stopped_as_the_server_expects() -> None:
    resources = _template()["Resources"]
    target_group = resources["TargetGroup"]["Properties"]
    assert target_group["HealthCheckPath"] == "/readyz"
    attributes = {
        a["Key"]: a["Value"] for a in resources["LoadBalancer"]["Properties"]["LoadBalancerAttributes"]
    }
    assert int(attributes["idle_timeout.timeout_seconds"]) >= 3600
    container = resources["TaskDefinition"]["Properties"]["ContainerDefinitions"][0]
    environment = {e["Name"]: e["Value"] for e in container["Environment"]}
    secrets = {e["Name"] for e in container.get("Secrets", [])}
    # Every variable is one the server knows, and it stops before ECS's SIGKILL.
    known = {f"MIFAMILIAS_{name.upper()}" for name in Settings.model_fields}
    assert set(environment) | secrets <= known, (set(environment) | secrets) - known
    assert float(environment["MIFAMILIAS_SHUTDOWN_SECONDS"]) < container["StopTimeout"]


def test_every_task_is_given_the_deployments_vapid_key() -> None:
    """The tasks share a table, so each is given the one VAPID key (a server
    on DynamoDB refuses to start without one): from a NoEcho parameter that
    takes what `python app.py vapid-key` prints, through a secret, not the
    task definition's plain environment."""
    template = _template()
    parameter = template["Parameters"]["VapidPrivateKey"]
    assert parameter["NoEcho"] is True and "Default" not in parameter
    resources = template["Resources"]
    assert resources["VapidKeySecret"]["Properties"]["SecretString"] == {"Ref": "VapidPrivateKey"}
    container = resources["TaskDefinition"]["Properties"]["ContainerDefinitions"][0]
    secrets = {e["Name"]: e["ValueFrom"] for e in container["Secrets"]}
    assert secrets["MIFAMILIAS_VAPID_PRIVATE_KEY"] == {"Ref": "VapidKeySecret"}
    environment = {e["Name"] for e in container["Environment"]}
    assert "MIFAMILIAS_VAPID_PRIVATE_KEY" not in environment
    reads = resources["ExecutionRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
    assert {
        "Effect": "Allow",
        "Action": "secretsmanager:GetSecretValue",
        "Resource": {"Ref": "VapidKeySecret"},
    } in reads

    printed = subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "vapid-key"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert re.fullmatch(parameter["AllowedPattern"], printed), printed
    # The tasks' region selects DynamoDB: without the key they would not start.
    assert "MIFAMILIAS_AWS_REGION" in environment
    with pytest.raises(ConfigError, match="MIFAMILIAS_VAPID_PRIVATE_KEY is needed with DynamoDB"):
        Settings.from_env({"MIFAMILIAS_AWS_REGION": "eu-west-1"}).check_serving()
    Settings.from_env(
        {"MIFAMILIAS_AWS_REGION": "eu-west-1", "MIFAMILIAS_VAPID_PRIVATE_KEY": printed}
    ).check_serving()


def test_the_image_recipe_copies_what_exists_and_installs_no_test_tools() -> None:
    recipe = DOCKERFILE.read_text()
    sources = [
        part
        for line in recipe.splitlines()
        if line.startswith("COPY ") and "--from=" not in line
        for part in line.split()[1:-1]
    ]
    assert sources, recipe
    for source in sources:
        assert (ROOT / source).exists(), source
    assert "pip install --no-cache-dir -e ." in recipe and "[test]" not in recipe
    user = re.search(r"^USER (\S+)", recipe, re.MULTILINE)
    assert user is not None and not user.group(1).startswith(("0", "root")), "runs as root"
    assert "HEALTHCHECK" in recipe and "healthcheck.py" in recipe


def _healthcheck(port: int) -> int:
    done = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "healthcheck.py")],
        env={**os.environ, "MIFAMILIAS_PORT": str(port)},
        timeout=30,
        check=False,
    )
    return done.returncode


def test_the_images_health_check_asks_healthz(live_server: ServerProcess) -> None:
    assert _healthcheck(live_server.port) == 0
    assert _healthcheck(free_port()) == 1  # nobody listening


def test_the_alarms_metric_filters_read_what_the_app_logs(tmp_path: Path) -> None:
    """Every field a metric filter of the template reads is written, numeric,
    in the JSON log lines of a real server (its scheduler's lag line included),
    and the tasks are told to log JSON."""
    import json
    import time

    template = _template()
    resources = template["Resources"]
    wanted: set[str] = set()
    for resource in resources.values():
        if resource["Type"] == "AWS::Logs::MetricFilter":
            wanted |= set(re.findall(r"\$\.(\w+)", resource["Properties"]["FilterPattern"]))
            for transformation in resource["Properties"]["MetricTransformations"]:
                wanted |= set(re.findall(r"\$\.(\w+)", str(transformation["MetricValue"])))
    assert "schedulerLagSeconds" in wanted
    containers = resources["TaskDefinition"]["Properties"]["ContainerDefinitions"]
    environment = {e["Name"]: e["Value"] for c in containers for e in c.get("Environment", [])}
    assert environment.get("MIFAMILIAS_LOG_FORMAT") == "json"

    server = ServerProcess(
        tmp_path, {"MIFAMILIAS_LOG_FORMAT": "json", "MIFAMILIAS_UNLOCK_POLL_SECONDS": "0.5"}
    ).start()
    try:
        deadline = time.monotonic() + 60  # bounds a failure only
        while True:
            lines = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
            found = {name for line in lines for name in wanted if isinstance(line.get(name), int | float)}
            if found == wanted or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        server.stop()
    assert found == wanted, (wanted - found, lines[-5:])
