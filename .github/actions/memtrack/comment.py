#!/usr/bin/env python3
"""Post memtrack's Markdown verdict on a pull request, updating its earlier comment in place.

The comment is found by a hidden marker at the start of its body, so every push to the pull
request edits one comment instead of adding another. Standard library only: it runs on any
runner with Python 3, before or without memtrack installed.

Environment: GITHUB_TOKEN (pull-requests: write), GITHUB_REPOSITORY, GITHUB_API_URL.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

MARKER = "<!-- memtrack -->"
MAX_BODY = 65_000  # GitHub refuses comments over 65,536 characters


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


def body_of(markdown: str) -> str:
    body = f"{MARKER}\n{markdown.strip()}\n"
    if len(body) > MAX_BODY:
        body = body[:MAX_BODY] + "\n\n... (cut: the whole verdict is in the job summary)\n"
    return body


def find_comment(api: str, repo: str, pr: int, token: str) -> dict[str, Any] | None:
    """The oldest comment on the pull request whose body starts with the marker."""
    page = 1
    while True:
        url = f"{api}/repos/{repo}/issues/{pr}/comments?per_page=100&page={page}"
        comments = _request("GET", url, token)
        for comment in comments:
            if (comment.get("body") or "").startswith(MARKER):
                return comment
        if len(comments) < 100:
            return None
        page += 1


def upsert(api: str, repo: str, pr: int, token: str, markdown: str) -> tuple[str, str]:
    """('updated' | 'created', the comment's URL)."""
    body = body_of(markdown)
    existing = find_comment(api, repo, pr, token)
    if existing is not None:
        url = f"{api}/repos/{repo}/issues/comments/{existing['id']}"
        done = _request("PATCH", url, token, {"body": body})
        return "updated", done.get("html_url", url)
    done = _request("POST", f"{api}/repos/{repo}/issues/{pr}/comments", token, {"body": body})
    return "created", done.get("html_url", "")


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
        markdown = args.body_file.read_text()
    except OSError as exc:
        print(f"comment: cannot read {args.body_file}: {exc}", file=sys.stderr)
        return 2
    try:
        action, url = upsert(api, repo, args.pr, token, markdown)
    except urllib.error.HTTPError as exc:
        hint = " (the job needs `permissions: pull-requests: write`)" if exc.code == 403 else ""
        print(f"comment: GitHub answered {exc.code} {exc.reason}{hint}", file=sys.stderr)
        return 1
    print(f"comment: {action} {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
