"""The graphql-ws client from npm, driven by Node: `tests/js/subscribe.mjs`
subscribes and prints each result as a JSON line, which these helpers read."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

JS = Path(__file__).resolve().parent / "js"


class GraphqlWs:
    """One subscription by graphql-ws in a Node process, until `count` results."""

    def __init__(self, url: str, token: str, query: str, variables: dict[str, Any], count: int) -> None:
        self.argv = ["node", str(JS / "subscribe.mjs"), url, token, query, json.dumps(variables), str(count)]
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> GraphqlWs:
        self.process = await asyncio.create_subprocess_exec(
            *self.argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        return self

    async def results(self, seconds: float = 120) -> list[dict[str, Any]]:
        """Every result it printed, once it has exited (the deadline bounds a failure only)."""
        assert self.process is not None
        out, err = await asyncio.wait_for(self.process.communicate(), seconds)
        lines = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
        assert self.process.returncode == 0, (lines, err.decode())
        return [line for line in lines if "ready" not in line]

    def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
