#!/bin/bash
# OpenAI's Codex CLI (`codex exec`, from the layer's node_modules: a static binary) on the task in
# $IDEGYM_INSTRUCTION, its model the episode's endpoint (the Responses API at $OPENAI_BASE_URL).
# Codex's own sandbox is off: the IdeGym sandbox is the boundary. Retries are off: the gateway
# answers every call or the episode ends.
set -u
layer="$(cd "$(dirname "$0")" && pwd)"
case "$(uname -m)" in
    x86_64) triple=x86_64-unknown-linux-musl; pkg=codex-linux-x64 ;;
    aarch64) triple=aarch64-unknown-linux-musl; pkg=codex-linux-arm64 ;;
    *) echo "idegym: no codex build for $(uname -m)" >&2; exit 2 ;;
esac
bin="$layer/node_modules/@openai/$pkg/vendor/$triple/bin/codex"
export CODEX_HOME="${TMPDIR:-/tmp}/idegym-codex-home"
mkdir -p "$CODEX_HOME"
"$bin" exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox --color never \
    -c model_provider=idegym -c 'model_providers.idegym.name="idegym"' \
    -c "model_providers.idegym.base_url=\"$OPENAI_BASE_URL\"" \
    -c 'model_providers.idegym.env_key="OPENAI_API_KEY"' -c 'model_providers.idegym.wire_api="responses"' \
    -c model_providers.idegym.request_max_retries=0 -c model_providers.idegym.stream_max_retries=0 \
    -m "${IDEGYM_MODEL_NAME:-idegym-policy}" "$IDEGYM_INSTRUCTION"
status=$?
echo "IDEGYM_RESULT {\"harness\": \"codex\", \"exit_status\": $status}"
exit $status
