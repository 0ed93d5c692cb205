#!/usr/bin/env python3
"""Post memtrack's Markdown verdict on a pull request, updating its earlier comment in place.

The comment is found by a hidden marker at the start of its body and by its author, the
token's own identity, so every push to the pull request edits one comment instead of adding
another, and a comment someone else wrote is never touched. Where an edit is refused, a new
comment is posted. Standard library only: it runs on any
runner with Python 3, before or without memtrack installed.

Environment: GITHUB_TOKEN (pull-requests: write), GITHUB_REPOSITORY, GITHUB_API_URL.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

MARKER = "<!-- memtrack -->"
MAX_BODY = 65_536
"""GitHub's limit on a comment, counted here in UTF-16 code units (an emoji is two)."""
CUT_NOTE = "\n... (cut: the whole verdict is in the job summary)\n"
EDIT_REFUSED = (403, 404)


def _request(method: str, url: str, token: str, payload: dict[str, Any] | None = None) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Accept", "application/vnd.github+json")
    req.add_header("X-GitHub-Api-Version", "2022-11-28")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read() or b"null")


def _size(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _closing(kept: str) -> str:
    """What closes the blocks left open in `kept`: a code fence, then <details> elements.
    Only tags that start a line are blocks: one inside a line is text (a case id in a code
    span, say), which never opens or closes anything."""
    fence = "```\n" if len(re.findall(r"^```", kept, re.MULTILINE)) % 2 else ""
    opened = len(re.findall(r"^<details\b", kept, re.IGNORECASE | re.MULTILINE))
    closed = len(re.findall(r"^</details\s*>", kept, re.IGNORECASE | re.MULTILINE))
    return fence + "</details>\n" * max(0, opened - closed)


def body_of(markdown: str) -> str:
    """The comment: the marker, then the verdict, cut at a line end within GitHub's limit
    with every block it leaves open closed."""
    body = f"{MARKER}\n{markdown.strip()}\n"
    if _size(body) <= MAX_BODY:
        return body
    budget = MAX_BODY - _size(CUT_NOTE)
    while True:
        kept = body[:budget]
        while _size(kept) > budget:  # characters outside the BMP count twice
            kept = kept[: len(kept) - (_size(kept) - budget)]
        kept = kept[: kept.rfind("\n") + 1]  # never half a line, a tag or a table row
        cut = kept + _closing(kept) + CUT_NOTE
        if _size(cut) <= MAX_BODY:
            return cut
        budget -= _size(cut) - MAX_BODY


def _login(name: str) -> str:
    """A login as comments show it and as the token's identity reports it: GitHub Actions'
    token is 'github-actions' to GraphQL and 'github-actions[bot]' on its comments."""
    name = name.strip().lower()
    return name[: -len("[bot]")] if name.endswith("[bot]") else name


def whoami(api: str, token: str) -> str | None:
    """The login the token acts as; None when GitHub will not say (then nothing is edited).

    GraphQL's `viewer` answers for a personal token, an app installation's token and the
    GITHUB_TOKEN of Actions alike; REST `/user` only for a personal token."""
    graphql = os.environ.get("GITHUB_GRAPHQL_URL") or f"{api}/graphql"
    try:
        return _login(
            _request("POST", graphql, token, {"query": "{ viewer { login } }"})["data"]["viewer"][
                "login"
            ]
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    try:
        return _login(_request("GET", f"{api}/user", token)["login"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def find_comment(api: str, repo: str, pr: int, token: str, me: str) -> dict[str, Any] | None:
    """The newest comment on the pull request that this token's identity wrote and whose
    body starts with the marker. Anyone can write the marker: others' are left alone."""
    found = None
    page = 1
    while True:
        url = f"{api}/repos/{repo}/issues/{pr}/comments?per_page=100&page={page}"
        comments = _request("GET", url, token)
        for comment in comments:
            author = _login(str((comment.get("user") or {}).get("login") or ""))
            if author == me and (comment.get("body") or "").startswith(MARKER):
                found = comment
        if len(comments) < 100:
            return found
        page += 1


def upsert(api: str, repo: str, pr: int, token: str, markdown: str) -> tuple[str, str]:
    """('updated' | 'created' | 'created (...)', the comment's URL)."""
    body = body_of(markdown)
    me = whoami(api, token)
    existing = find_comment(api, repo, pr, token, me) if me else None
    action = "created" if me else "created (the token's identity is unknown: nothing edited)"
    if existing is not None:
        url = f"{api}/repos/{repo}/issues/comments/{existing['id']}"
        try:
            done = _request("PATCH", url, token, {"body": body})
            return "updated", done.get("html_url", url)
        except urllib.error.HTTPError as exc:
            if exc.code not in EDIT_REFUSED:
                raise
            action = f"created (editing comment {existing['id']} was refused: {exc.code})"
    done = _request("POST", f"{api}/repos/{repo}/issues/{pr}/comments", token, {"body": body})
    return action, done.get("html_url", "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pr", type=int, required=True, help="pull request number")
    parser.add_argument("--body-file", type=Path, required=True, help="the Markdown verdict")
    args = parser.parse_args(argv)
    token = os.environ.get("GITHUB_TOKEN", "")
    repo = os.environ.get("GITHUB_REPOSITORY", "")
    api = os.environ.get("GITHUB_API_URL", "https://api.github.com").rstrip("/")
    if not token or not repo:
        print("comment: GITHUB_TOKEN and GITHUB_REPOSITORY must be set", file=sys.stderr)
        return 2
    try:
        markdown = args.body_file.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        print(f"comment: cannot read {args.body_file}: {exc}", file=sys.stderr)
        return 2
    try:
        action, url = upsert(api, repo, args.pr, token, markdown)
    except urllib.error.HTTPError as exc:
        hint = " (the job needs `permissions: pull-requests: write`)" if exc.code == 403 else ""
        print(f"comment: GitHub answered {exc.code} {exc.reason}{hint}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:  # no answer, or not JSON
        print(f"comment: GitHub could not be reached at {api}: {exc}", file=sys.stderr)
        return 1
    print(f"comment: {action} {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
