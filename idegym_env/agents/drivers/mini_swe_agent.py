"""mini-swe-agent's own loop (DefaultAgent, LocalEnvironment, its LiteLLM model and mini.yaml's
prompts) on the task in the current directory, its model being the episode's endpoint.

Runs inside the sandbox with the sandbox's python3 (the layer's ``site`` first on sys.path):
``python3 -I mini_swe_agent.py`` with the task in ``$IDEGYM_INSTRUCTION``. Prints one JSON line (``IDEGYM_RESULT``) with
how the agent ended. Exit status 0 whenever the agent's loop ended by itself.
"""

import json
import os
import sys

LAYER = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(LAYER, "site"))
with open(os.path.join(LAYER, "manifest.json")) as fh:
    WANT = json.load(fh)["python"]
HAVE = f"{sys.version_info.major}.{sys.version_info.minor}"
if WANT != HAVE:
    sys.exit(f"idegym: this harness layer was built for Python {WANT}; the sandbox's python3 is {HAVE}")

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price list
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")  # the gateway answers, or the episode ends
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", os.path.join(os.environ.get("TMPDIR", "/tmp"), "mini-swe-agent"))

import yaml  # noqa: E402
from minisweagent import __version__  # noqa: E402
from minisweagent.agents.default import AgentConfig, DefaultAgent  # noqa: E402
from minisweagent.config import builtin_config_dir  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402


def main() -> int:
    task = os.environ["IDEGYM_INSTRUCTION"]
    config = yaml.safe_load((builtin_config_dir / "mini.yaml").read_text())
    agent_config = {k: v for k, v in config["agent"].items() if k in AgentConfig.model_fields}
    agent_config.update(step_limit=int(os.environ.get("IDEGYM_STEP_LIMIT", "0")), cost_limit=0)
    model_config = dict(config.get("model", {}))
    model_config["model_kwargs"] = {**model_config.get("model_kwargs", {}),
                                    "api_base": os.environ["OPENAI_BASE_URL"],
                                    "api_key": os.environ["OPENAI_API_KEY"]}
    model_config["model_name"] = "openai/" + os.environ.get("IDEGYM_MODEL_NAME", "idegym-policy")
    model_config["cost_tracking"] = "ignore_errors"
    env_config = dict(config.get("environment", {}))
    env_config.pop("environment_class", None)
    env_config.update(cwd=os.getcwd(), timeout=int(os.environ.get("IDEGYM_COMMAND_TIMEOUT", "120")))
    agent = DefaultAgent(LitellmModel(**model_config), LocalEnvironment(**env_config), **agent_config)
    result = agent.run(task)
    print("IDEGYM_RESULT " + json.dumps({"harness": "mini-swe-agent", "version": __version__,
                                         "exit_status": result.get("exit_status"),
                                         "submission": result.get("submission", "")[:2000]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
