"""Solve an IdeGym task through ``idegym mcp serve`` with the official MCP SDK's client
(pip install 'idegym[mcp]').

    python examples/integrations/mcp_client.py                       # starts the server over stdio
    python examples/integrations/mcp_client.py http://127.0.0.1:8765/mcp   # a running HTTP server

An agent framework that speaks MCP does the same: list the tools, call them, read submit's reward.
"""

import sys

import anyio
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

from idegym_env.tasks import load_task


async def main() -> None:
    server = sys.argv[1] if len(sys.argv) > 1 else StdioServerParameters(
        command=sys.executable, args=["-m", "idegym_env.cli", "mcp", "serve", "--task", "python-roman-numerals"])
    fix = load_task("python-roman-numerals").solution[0].arguments.model_dump()
    async with Client(server) as client:
        print([tool.name for tool in (await client.list_tools()).tools])
        episode = (await client.call_tool("reset", {})).structured_content
        print(episode["instruction"])
        await client.call_tool("edit_file", fix)
        print((await client.call_tool("run_checks", {})).content[0].text)
        print("reward:", (await client.call_tool("submit", {})).structured_content["reward"])


anyio.run(main)
