#!/bin/bash
# Anthropic's Claude Code CLI (`claude -p`, from the layer's node_modules: its native binary) on the
# task in $IDEGYM_INSTRUCTION, its model the episode's endpoint (Anthropic's Messages API at
# $ANTHROPIC_BASE_URL). Its permission prompts are off: the IdeGym sandbox is the boundary.
# Non-essential traffic (telemetry, updates) is off: the sandbox has no network anyway.
set -u
layer="$(cd "$(dirname "$0")" && pwd)"
bin="$layer/node_modules/@anthropic-ai/claude-code/bin/claude.exe"
export CLAUDE_CONFIG_DIR="${TMPDIR:-/tmp}/idegym-claude"
export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1
export IS_SANDBOX=1  # a run_as_root sandbox's root is no host root
mkdir -p "$CLAUDE_CONFIG_DIR"
"$bin" -p "$IDEGYM_INSTRUCTION" --dangerously-skip-permissions --model "${IDEGYM_MODEL_NAME:-idegym-policy}" \
    < /dev/null
status=$?
echo "IDEGYM_RESULT {\"harness\": \"claude-code\", \"exit_status\": $status}"
exit $status
