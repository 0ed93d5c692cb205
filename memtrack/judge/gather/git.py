"""What the judge asks git: the ancestry of a merge-base, the base branch's first-parent
order, a commit range for a bisection, the trailers of a range, the config at a revision.
Each answer is data; a repository git cannot read gives None (or nothing) and a note."""

from __future__ import annotations

import re
from pathlib import Path

from memtrack.config import Config, config_from_text
from memtrack.errors import ConfigError
from memtrack.judge import accept
from memtrack.judge.verdict import BudgetChange
from memtrack.machine.provenance import git_output

ANCESTRY_FIRST = 512
"""Ancestors listed at first; the list doubles while an older baseline commit is asked for."""
SHA = re.compile(r"^[0-9a-fA-F]{4,64}$")


class Ancestry:
    """Commits reachable from a revision, listed lazily (newest first, doubling)."""

    def __init__(self, root: Path, rev: str):
        self.root, self.rev = root, rev
        self.commits: set[str] = set()
        self.oldest: float | None = None
        self.count = 0
        self.complete = False

    def _load(self) -> None:
        self.count = max(ANCESTRY_FIRST, self.count * 2)
        out = (
            git_output(self.root, "log", "--format=%H %ct", "-n", str(self.count), revs=(self.rev,))
            or ""
        )
        lines = out.splitlines()
        self.commits = {line.split()[0] for line in lines}
        times = [float(line.split()[1]) for line in lines]
        self.oldest = min(times) if times else None
        self.complete = len(lines) < self.count

    def contains(self, sha: str, committed_at: float | None) -> bool:
        if not self.count:
            self._load()
        while True:
            if sha in self.commits:
                return True
            if self.complete:
                return False
            # A commit newer than everything listed would have been listed: not an ancestor.
            if committed_at is not None and self.oldest is not None and committed_at >= self.oldest:
                return False
            self._load()


def repository_state(root: Path, commit: str | None) -> tuple[bool, bool, bool]:
    """(inside a work tree, a shallow clone, `commit` is one of its commits)."""
    flags = (
        git_output(root, "rev-parse", "--is-inside-work-tree", "--is-shallow-repository") or ""
    ).split()
    inside = flags[:1] == ["true"]
    shallow = flags[1:2] == ["true"]
    return inside, shallow, inside and commit is not None and has_commit(root, commit)


def has_commit(root: Path, commit: str) -> bool:
    return git_output(root, "cat-file", "-e", revs=(f"{commit}^{{commit}}",)) is not None


def merge_base(root: Path, commit: str, base_branch: str) -> str | None:
    """The merge-base of `commit` with the base branch (or its remote-tracking branch)."""
    for ref in (base_branch, f"origin/{base_branch}"):
        mb = git_output(root, "merge-base", revs=(commit, ref))
        if mb:
            return mb
    return None


def commit_time(root: Path, commit: str) -> str | None:
    """The commit's time (ISO 8601), or None where git does not know it."""
    return git_output(root, "show", "-s", "--format=%cI", revs=(commit,))


def first_parent_order(root: Path, base_branch: str) -> dict[str, int] | None:
    """Commit -> its position on the base branch's first-parent history (oldest 1); None
    where the branch is unknown here."""
    for ref in (base_branch, f"origin/{base_branch}"):
        commits = first_parent(root, ref, 100_000)
        if commits:
            return {c: len(commits) - i for i, c in enumerate(commits)}
    return None


def first_parent(root: Path, rev: str, n: int) -> list[str]:
    """The newest `n` commits of `rev`'s first-parent history, newest first (none where git
    does not know `rev`)."""
    out = git_output(root, "rev-list", "--first-parent", "-n", str(n), revs=(rev,))
    return (out or "").split()


def spanned(root: Path, previous: str, commit: str) -> int | None:
    """How many commits `commit` brings after `previous` (a merged branch's too)."""
    out = git_output(root, "rev-list", "--count", revs=(f"{previous}..{commit}",))
    return int(out) if out and out.isdigit() else None


def resolve(root: Path, rev: str) -> str | None:
    """A revision's commit, or None."""
    return git_output(root, "rev-parse", "--verify", "--quiet", revs=(f"{rev}^{{commit}}",))


def subject(root: Path, commit: str) -> str | None:
    return git_output(root, "show", "-s", "--format=%s", revs=(commit,))


def commits_between(root: Path, good: str, bad: str) -> tuple[str, str, list[str]]:
    """GOOD's and BAD's commits and the commits after GOOD up to BAD, oldest first (a merged
    branch's commits before its merge); ConfigError naming what is wrong (an unknown ref,
    GOOD not an ancestor of BAD)."""
    shas = []
    for name, ref in (("GOOD", good), ("BAD", bad)):
        sha = resolve(root, ref)
        if not sha:
            raise ConfigError(f"{name}: {ref!r} is no commit of the repository at {root}")
        shas.append(sha)
    good_sha, bad_sha = shas
    if good_sha == bad_sha:
        raise ConfigError(f"GOOD and BAD are the same commit ({good_sha[:12]})")
    if git_output(root, "merge-base", "--is-ancestor", revs=(good_sha, bad_sha)) is None:
        raise ConfigError(f"GOOD {good!r} is not an ancestor of BAD {bad!r}")
    listed = git_output(
        root,
        "rev-list",
        "--ancestry-path",
        "--topo-order",
        "--reverse",
        revs=(f"{good_sha}..{bad_sha}",),
    )
    return good_sha, bad_sha, (listed or "").split()


_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


def changed_lines(root: Path, base: str | None, head: str | None) -> dict[str, tuple[int, ...]]:
    """The lines `head` adds or changes against `base` (`git diff base head`), by file as
    the root names it (files outside the root left out); empty where git cannot say (no
    base, a shallow clone without it)."""
    if not base or not head or base == head:
        return {}
    out = git_output(
        root,
        "-c",
        "core.quotepath=false",
        "diff",
        "--unified=0",
        "--no-color",
        "--no-ext-diff",
        "--relative",
        revs=(base, head),
    )
    changed: dict[str, list[int]] = {}
    file: str | None = None
    for line in (out or "").splitlines():
        if line.startswith("+++ "):
            path = line[4:].removesuffix("\t")  # git ends a name holding a space with a tab
            file = path[2:] if path.startswith("b/") else None  # '/dev/null', or quoted
        elif file is not None and (hunk := _HUNK.match(line)):
            first, count = int(hunk[1]), int(hunk[2] if hunk[2] is not None else 1)
            changed.setdefault(file, []).extend(range(first, first + count))
    return {f: tuple(lines) for f, lines in changed.items() if lines}


def acceptances(
    root: Path, since: str | None, until: str | None
) -> tuple[list[accept.Acceptance], list[str]]:
    """The `Memtrack-Accept` trailers in the commits after `since` up to `until` (git's
    since..until), and notes on what could not be read. Never raises: a bad trailer is a
    note, not an error."""
    if not until or not SHA.match(until) or (since is not None and not SHA.match(since)):
        return [], []
    span = f"{since}..{until}" if since else until
    out = git_output(
        root,
        "log",
        "--format=%H%x00%(trailers:key=" + accept.TRAILER + ",valueonly,separator=%x01)%x00",
        revs=(span,),
    )
    if out is None:
        return [], [
            f"acceptances not read: the commits {span[:40]} are not in the repository at {root}"
        ]
    found, notes = [], []
    for record in out.split("\x00\n"):
        sha, _, values = record.strip("\n").partition("\x00")
        for value in filter(None, (v.strip() for v in values.strip("\x00").split("\x01"))):
            try:
                found.append(accept.parse(sha, value))
            except ConfigError as exc:
                notes.append(f"ignored: {exc}")
    return found, notes


def budget_changes(
    config: Config, root: Path, rev: str | None
) -> tuple[list[BudgetChange], str | None]:
    """Budgets the current config changes relative to the same file at `rev`, and a note
    where they could not be compared."""
    if config.path is None:
        return [], None
    quiet = not config.budgets  # nothing to raise: a missing base is not worth a note
    if rev is None:
        return [], None if quiet else "budget changes not checked: no base revision to compare with"
    top = git_output(root, "rev-parse", "--show-toplevel")
    if top is None:
        return [], "budget changes not checked: the config is not in a git repository"
    try:
        rel = config.path.resolve().relative_to(Path(top).resolve()).as_posix()
    except ValueError:
        return [], "budget changes not checked: the config is outside the repository"
    if resolve(root, rev) is None:
        note = (
            f"budget changes not checked: {rev} is not in this clone (shallow?), so the "
            "config cannot be compared with the base's"
        )
        return [], None if quiet else note
    text = git_output(root, "show", revs=(f"{rev}:{rel}",))
    if text is None:
        return [], None  # the file is new here: its budgets are all new
    try:
        old = config_from_text(text, config.path)
    except ConfigError as exc:
        return [], f"budget changes not checked: the base config does not load ({exc})"
    return compare_budgets(old, config), None


def compare_budgets(old: Config, new: Config) -> list[BudgetChange]:
    """Each budget added, removed, raised or lowered from `old` to `new`."""

    def key(b: object) -> tuple[str, str, str]:
        return (b.workload, b.metric or "", b.gpu or "")  # type: ignore[attr-defined]

    before = {key(b): b for b in old.budgets}
    after = {key(b): b for b in new.budgets}
    out = []
    for k in sorted(set(before) | set(after)):
        a, b = before.get(k), after.get(k)
        if a and b and a.limit_bytes == b.limit_bytes:
            continue
        change = (
            "added"
            if a is None
            else "removed"
            if b is None
            else "raised"
            if b.limit_bytes > a.limit_bytes
            else "lowered"
        )
        ref = b or a
        assert ref is not None
        out.append(
            BudgetChange(
                ref.workload,
                ref.metric,
                ref.gpu,
                change,
                a.limit_bytes if a else None,
                b.limit_bytes if b else None,
                ref.reason,
            )
        )
    return out


__all__ = [
    "ANCESTRY_FIRST",
    "SHA",
    "Ancestry",
    "acceptances",
    "budget_changes",
    "changed_lines",
    "commit_time",
    "commits_between",
    "compare_budgets",
    "first_parent",
    "first_parent_order",
    "has_commit",
    "merge_base",
    "repository_state",
    "resolve",
    "spanned",
    "subject",
]
