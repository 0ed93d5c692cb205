#!/usr/bin/env bash
# Pre-job hook for a self-hosted GPU runner: refuse every job that could run a fork's code.
#
# The workflow's `if:` keeps fork pull requests off the runner, but a pull request can edit
# the workflow it runs. This hook runs on the runner itself, outside the repository's
# control, before every job. Install it in the runner's .env file and restart the runner:
#
#   ACTIONS_RUNNER_HOOK_JOB_STARTED=/opt/memtrack/memtrack-runner-hook.sh
#   MEMTRACK_ALLOWED_REPOSITORIES=owner/repo     # optional, space-separated
#
# Allowed: push, workflow_dispatch and schedule (only people with write access can cause
# them), and pull_request from a branch of the same repository. Everything else exits 1,
# which fails the job before any of its steps runs.
set -euo pipefail

refuse() {
    echo "memtrack runner hook: refusing this job: $*" >&2
    exit 1
}

event="${GITHUB_EVENT_NAME:-}"
repo="${GITHUB_REPOSITORY:-}"
[ -n "$event" ] && [ -n "$repo" ] || refuse "GITHUB_EVENT_NAME or GITHUB_REPOSITORY is not set"

if [ -n "${MEMTRACK_ALLOWED_REPOSITORIES:-}" ]; then
    case " $MEMTRACK_ALLOWED_REPOSITORIES " in
        *" $repo "*) ;;
        *) refuse "repository $repo is not in MEMTRACK_ALLOWED_REPOSITORIES" ;;
    esac
fi

case "$event" in
    push | workflow_dispatch | schedule)
        ;;
    pull_request)
        [ -r "${GITHUB_EVENT_PATH:-}" ] || refuse "no event payload to read (GITHUB_EVENT_PATH)"
        head="$(python3 -c '
import json, sys
event = json.load(open(sys.argv[1]))
head = ((event.get("pull_request") or {}).get("head") or {}).get("repo") or {}
print(head.get("full_name") or "")
' "$GITHUB_EVENT_PATH")" || refuse "cannot read the event payload"
        [ "$head" = "$repo" ] || refuse "pull request from ${head:-an unknown repository}, not from $repo"
        ;;
    *)
        refuse "event '$event' may not run on this runner"
        ;;
esac
echo "memtrack runner hook: $event on $repo allowed"
