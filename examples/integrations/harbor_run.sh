#!/bin/bash
# Run Harbor tasks on IdeGym sandboxes with Harbor's own CLI (no Docker): `make harbor-venv` first
# (Harbor needs Python >= 3.12). Usage: examples/integrations/harbor_run.sh TASKS_DIR [AGENT]
set -euo pipefail
tasks=${1:?usage: harbor_run.sh TASKS_DIR [AGENT]}
agent=${2:-oracle}
# Harbor's LLM layer otherwise fetches a price list from the internet at start-up.
export LITELLM_LOCAL_MODEL_COST_MAP=True
exec .venv-harbor/bin/harbor run --path "$tasks" --agent "$agent" --n-concurrent 4 --yes \
    --env idegym_env.integrations.harbor:IdeGymEnvironment \
    ${IDEGYM_URL:+--ek control_plane_url="$IDEGYM_URL"}
