"""Run under Python 3.12 with the published idegym-client 0.13.1 (see tests/test_oci_images.py).

Starts a server of IMAGE, writes a small project with two passing tests unless the image has
them, runs ``server.test_reward(SCRIPT)`` and prints the report as one JSON line.
Usage: python published_client_test_reward.py <control-plane-url> <image> <test script> [--write-tests],
with the credentials in $IDEGYM_AUTH_USERNAME / $IDEGYM_AUTH_PASSWORD (the client reads them itself).
"""

import asyncio
import json
import sys

from idegym.api.orchestrator.servers import ServerReuseStrategy
from idegym.client import IdeGYMClient


async def main(url: str, image: str, script: str, write_tests: bool) -> None:
    async with IdeGYMClient(orchestrator_url=url, name="reward", namespace="idegym") as client:
        server = await client.start_server(image_tag=image, reuse_strategy=ServerReuseStrategy.NONE,
                                           server_start_wait_timeout_in_seconds=120)
        if write_tests:
            await server.create_file("src/__init__.py", "")
            await server.create_file("src/calc.py", "def add(a, b):\n    return a + b\n")
            await server.create_file("test_calc.py", "from src.calc import add\n\n\ndef test_add():\n"
                                     "    assert add(2, 3) == 5\n\n\ndef test_add_negative():\n"
                                     "    assert add(-2, -3) == -5\n")
        report = await server.test_reward(script)
        print("REPORT " + json.dumps({"status": report.status, "scores": report.scores.model_dump()}), flush=True)
        await client.stop_server(server)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], "--write-tests" in sys.argv[4:]))
