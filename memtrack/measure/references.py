"""Reference outputs: the manifest that pins them, and recording them with `memtrack reference`.

A case that declares a tolerance is compared, on every run, with the output of its reference
case: the same params at full precision (dtype float32, each format param at its reference
value). `memtrack reference` runs the reference case in a worker, as `memtrack run` does,
and saves the output of the call after the memory pass (the call a run compares, so a step
that changes state is compared at the same point) as CPU float32 tensors. The manifest,
`manifest.json` in the references folder, maps each reference case id to its file and the
file's sha256 (and the device it was recorded on): a reviewed file like any other. A file
whose sha256 differs is refused; one recorded on another kind of device is compared, with a
warning that opens the quality message. This module does not import torch; the worker does.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memtrack.config import MAX_CONFIG_BYTES, Config
from memtrack.errors import ConfigError, WorkloadError
from memtrack.files import NotReadable, read_text
from memtrack.machine.provenance import git_ignore_rule
from memtrack.measure.case import run_case
from memtrack.probes.quality import QualitySpec
from memtrack.workload.registry import Case

if TYPE_CHECKING:
    from memtrack.measure.forkserver import ForkServer

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,200}$")
"""A reference file is a plain name inside the references folder: no path, no '..'."""
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def folder(config: Config) -> Path:
    return (
        config.references if config.references.is_absolute() else (config.root / config.references)
    )


def manifest_path(config: Config) -> Path:
    return folder(config) / MANIFEST


def load_manifest(config: Config) -> dict[str, dict[str, Any]]:
    """Reference case id -> its entry ({'file', 'sha256', ...}); {} without a manifest.
    Raises ConfigError (one line, naming the file and key) for a malformed one."""
    path = manifest_path(config)
    try:
        text = read_text(path, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, NotReadable) as exc:
        raise ConfigError(f"{path}: cannot be read ({exc})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
        raise ConfigError(f"{path}: not a reference manifest of version {MANIFEST_VERSION}")
    refs = data.get("references")
    if not isinstance(refs, dict):
        raise ConfigError(f"{path}: references: expected an object of case id -> entry")
    for case, entry in refs.items():
        where = f"{path}: references[{case!r}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected an object")
        file, sha = entry.get("file"), entry.get("sha256")
        if not isinstance(file, str) or not _FILE.match(file):
            raise ConfigError(f"{where}.file: {file!r} is not a file name in {path.parent}")
        if not isinstance(sha, str) or not _SHA256.match(sha):
            raise ConfigError(f"{where}.sha256: {sha!r} is not a sha256 (64 hex digits)")
    return refs


def quality_spec(
    config: Config, case: Case, manifest: dict[str, dict[str, Any]] | None = None
) -> QualitySpec | None:
    """What the worker needs to compare a case's output: its reference's id, file and pinned
    sha256 (None where none is recorded); None where the workload declares no tolerance."""
    if not case.tolerance:
        return None
    ref = case.reference_case().case_id
    entry = (load_manifest(config) if manifest is None else manifest).get(ref)
    device = entry.get("device") if entry else None
    return QualitySpec(
        mode="compare",
        reference=ref,
        path=str(folder(config) / entry["file"]) if entry else None,
        sha256=entry["sha256"] if entry else None,
        device=device if isinstance(device, str) else None,
    )


def file_name(case_id: str) -> str:
    """A stable, plain file name for a reference case: workload and a hash of the id."""
    workload = re.sub(r"[^A-Za-z0-9_]", "_", case_id.partition("[")[0])[:80] or "case"
    return f"{workload}-{hashlib.sha256(case_id.encode()).hexdigest()[:12]}.pt"


@dataclass(frozen=True)
class Recorded:
    """One reference written by `record_references`."""

    case_id: str
    path: Path
    entry: dict[str, Any]
    """Its manifest entry: its file, sha256, dtype, shapes and commit."""
    for_cases: tuple[str, ...]
    """The selected cases it is the reference of."""

    @property
    def sha256(self) -> str:
        return str(self.entry["sha256"])


def reference_cases(cases: Iterable[Case]) -> dict[str, tuple[Case, list[str]]]:
    """Reference case id -> (the reference case, the selected cases it serves), for the
    cases that declare a tolerance."""
    out: dict[str, tuple[Case, list[str]]] = {}
    for case in cases:
        if case.tolerance:
            ref = case.reference_case()
            out.setdefault(ref.case_id, (ref, []))[1].append(case.case_id)
    return out


def record_references(
    config: Config,
    cases: list[Case],
    device: str,
    commit: str | None = None,
    progress: Callable[[str], None] | None = None,
    server: ForkServer | None = None,
) -> list[Recorded]:
    """Run each selected case's reference case and pin its output (forked by `server` where
    there is one). All or nothing: every reference is measured before any file or the
    manifest changes. Raises WorkloadError when a case fails or its step returns no
    tensor."""
    refs = reference_cases(cases)
    if not refs:
        raise WorkloadError(
            "no selected case declares a tolerance: a reference is kept only "
            "for workloads declared with tolerance={...}"
        )
    manifest = load_manifest(config)  # a malformed manifest is refused before measuring
    target = folder(config)
    rule = git_ignore_rule(config.root, target / MANIFEST)
    if rule:
        where = f"set `references` in {config.path}" if config.path else "set `references`"
        raise ConfigError(
            f"{target}: git ignores it ({rule}), and references must be "
            f"committed: {where} to a folder git keeps, or un-ignore it"
        )
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"{target}: cannot create the references folder ({exc.strerror})"
        ) from None
    done: list[tuple[Recorded, Path]] = []
    try:
        for ref_id, (ref, served) in refs.items():
            if progress:
                progress(ref_id)
            tmp = target / f".{file_name(ref_id)}.tmp"
            m = run_case(
                config,
                ref,
                device,
                quality=QualitySpec(mode="record", path=str(tmp)),
                server=server,
            )
            if m.status != "ok":
                why = (m.message or "").removeprefix("OutputError: ")
                status = "" if m.status == "error" else f"{m.status}: "
                raise WorkloadError(f"{ref_id}: no reference recorded: {status}{why}")
            meta = json.loads(Path(f"{tmp}.json").read_text())
            Path(f"{tmp}.json").unlink()
            sha = hashlib.sha256(tmp.read_bytes()).hexdigest()
            entry = {"file": file_name(ref_id), "sha256": sha, **meta, "commit": commit}
            done.append((Recorded(ref_id, target / entry["file"], entry, tuple(served)), tmp))
        for rec, tmp in done:
            tmp.replace(rec.path)
    finally:  # nothing half-recorded stays behind
        for ref_id in refs:
            stale = target / f".{file_name(ref_id)}.tmp"
            stale.unlink(missing_ok=True)
            Path(f"{stale}.json").unlink(missing_ok=True)
    _write_manifest(config, {**manifest, **{r.case_id: r.entry for r, _ in done}})
    return [r for r, _ in done]


def _write_manifest(config: Config, refs: dict[str, dict[str, Any]]) -> None:
    """Sorted and indented, so that a changed reference reads as a small diff."""
    path = manifest_path(config)
    tmp = path.with_name(path.name + ".tmp")
    text = json.dumps({"version": MANIFEST_VERSION, "references": refs}, indent=2, sort_keys=True)
    try:
        tmp.write_text(text + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"{path}: cannot be written ({exc.strerror})") from None


__all__ = [
    "MANIFEST",
    "Recorded",
    "file_name",
    "folder",
    "load_manifest",
    "quality_spec",
    "record_references",
    "reference_cases",
]
