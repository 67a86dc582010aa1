"""NeMo Gym's sandbox API on the ``idegym`` provider (pip install 'idegym[nemo-gym]', Python >= 3.12).

    python examples/integrations/nemo_gym_sandbox.py

NeMo Gym finds the provider through this package's ``nemo_gym.sandbox_providers`` entry point, so
selecting it is YAML alone::

    sandbox:
      idegym:
        control_plane_url: http://127.0.0.1:8000   # optional: default $IDEGYM_URL, else an embedded control plane
    ...
      sandbox_provider: sandbox                     # in the agent's config (e.g. mini_swe_agent_2)

An image ``idegym-task:<task>`` plays that IdeGym task (its image, files and limits) and can be
graded; any other image is one of the control plane's store (e.g. ``idegym/builtin:latest``).
"""

from nemo_gym.sandbox import Sandbox, SandboxSpec, list_providers, resolve_provider_config
from omegaconf import OmegaConf

from idegym_env.integrations.nemo_gym import grade
from idegym_env.tasks import load_task

config = OmegaConf.create({"sandbox": {"idegym": {}}, "agent": {"sandbox_provider": "sandbox"}})
provider = resolve_provider_config(config.agent.sandbox_provider, config)
print("providers:", list_providers(), "->", provider)

box = Sandbox(provider).start(SandboxSpec(image="idegym-task:python-roman-numerals"))
try:
    print(box.exec("ls; python3 -c 'import roman; print(roman.to_roman(4))'").stdout)
    fix = load_task("python-roman-numerals").solution[0].arguments
    source = box.exec(f"cat {fix.path}").stdout.splitlines(keepends=True)
    source[fix.start_line - 1:fix.end_line] = [fix.new_content]
    with open("/tmp/roman_fixed.py", "w") as f:
        f.write("".join(source))
    box.upload("/tmp/roman_fixed.py", fix.path)  # into the task's project
    graded = grade(box)  # the task's checks, as IdeGym grades a submit
    print("reward:", graded["reward"])
finally:
    box.stop()
