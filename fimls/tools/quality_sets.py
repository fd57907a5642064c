"""The repositories quality is measured on (``docs/measurements/quality-sets.toml``), split
into a tuning set and a report set, and the real-edit tasks made from each.

The file is fixed before results are looked at; see its header for the rules. Each entry
names a public repository (``owner/name``), the revision its history is read from, and the
file extensions its tasks come from. The repositories themselves are local git mirrors,
one folder per repository named ``owner+name`` (a bare repository, or a folder holding one
as ``repo``), as the project's fetch tooling lays them out.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fimls.tools.harness import Task
from fimls.tools.tasks import Limits, from_git, write_jsonl

SPLITS = ("tuning", "report")


@dataclass(frozen=True)
class RepoSpec:
    """One repository of a split."""

    repo: str  # owner/name
    split: str
    rev: str | None = None  # None: not measured (listed so that it is never reported)
    ext: tuple[str, ...] = ()

    @property
    def folder(self) -> str:
        """The mirror's folder name."""
        return self.repo.replace("/", "+")


@dataclass(frozen=True)
class QualitySets:
    """The whole file: the repositories and the task-making defaults."""

    repos: tuple[RepoSpec, ...]
    tasks: int = 40
    seed: int = 1

    def split(self, name: str, only: Sequence[str] = ()) -> list[RepoSpec]:
        """The measurable repositories of one split (those with a revision); with ``only``,
        just those of them (owner/name, any case)."""
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r} (one of {', '.join(SPLITS)})")
        specs = [r for r in self.repos if r.split == name and r.rev]
        if not only:
            return specs
        wanted = {o.lower() for o in only}
        unknown = wanted - {r.repo.lower() for r in specs}
        if unknown:
            raise ValueError(f"not measurable in the {name} set: {', '.join(sorted(unknown))}")
        return [r for r in specs if r.repo.lower() in wanted]


def parse_sets(data: dict[str, Any]) -> QualitySets:
    """A parsed TOML document as :class:`QualitySets`; a repository in both splits is an
    error, since then the report set would hold what defaults were tuned on."""
    repos: list[RepoSpec] = []
    for split in SPLITS:
        for entry in data.get(split, []):
            repos.append(RepoSpec(repo=str(entry["repo"]), split=split,
                                  rev=entry.get("rev"),
                                  ext=tuple(str(e).lstrip(".") for e in entry.get("ext", ()))))
    names = [r.repo.lower() for r in repos]
    both = sorted({n for n in names if names.count(n) > 1})
    if both:
        raise ValueError(f"listed twice (a repository is in one split only): {', '.join(both)}")
    defaults = data.get("defaults", {})
    return QualitySets(tuple(repos), tasks=int(defaults.get("tasks", 40)),
                       seed=int(defaults.get("seed", 1)))


def load_sets(path: Path | str) -> QualitySets:
    """Read the quality-sets file."""
    import tomllib

    with open(path, "rb") as f:
        return parse_sets(tomllib.load(f))


def mirror_of(mirrors: Path, spec: RepoSpec) -> Path:
    """Where ``spec``'s git repository lies under ``mirrors``."""
    base = mirrors / spec.folder
    return base / "repo" if (base / "repo").exists() else base


def repo_tasks(spec: RepoSpec, mirrors: Path, n: int, seed: int,
               cache: Path | None = None) -> list[Task]:
    """Up to ``n`` real-edit tasks from ``spec``'s history at its pinned revision (written
    to, and read back from, ``cache``/owner+name.jsonl when given: the same tasks every run)."""
    path = cache / f"{spec.folder}-{n}-{seed}.jsonl" if cache else None
    if path is None or not path.exists():
        limits = Limits(extensions=frozenset(f".{e}" for e in spec.ext)) if spec.ext else None
        rows, _skipped = from_git(mirror_of(mirrors, spec), n=n, seed=seed,
                                  rev=spec.rev or "HEAD", limits=limits)
        if path is None:
            return [_task(r) for r in rows]
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as out:
            write_jsonl(rows, out)
    with open(path, encoding="utf-8") as f:
        return [_task(json.loads(line)) for line in f if line.strip()]


_COMMIT = re.compile(r"^[^/]+/([0-9a-f]{7,40})/")


def checkout(spec: RepoSpec, mirrors: Path, task: Task, under: Path) -> Path:
    """The repository as it was before ``task``'s commit (the files its developer had
    around them), extracted once under ``under``; the folder is named ``repo``, as the
    bench's workspace without checkouts, so that the prompt's repository name is the same."""
    found = _COMMIT.match(task.task_id)
    if found is None:
        raise ValueError(f"{task.task_id}: not a task made from a commit")
    dest = under / spec.folder / found.group(1) / "repo"
    if dest.exists():
        return dest
    tmp = dest.with_name("repo.part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # A first commit has no parent: nothing was there before it.
    extract_tree(mirror_of(mirrors, spec), f"{found.group(1)}^", tmp)
    tmp.rename(dest)
    return dest


def extract_tree(repo: Path, rev: str, dest: Path) -> bool:
    """The files of ``repo`` at ``rev`` written under ``dest``; False if ``rev`` is not there."""
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev],
                             capture_output=True)
    if archive.returncode != 0:
        return False
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return True


def _task(row: dict[str, Any]) -> Task:
    return Task(str(row["task_id"]), row["prefix"], row["suffix"], row["target"],
                path=str(row.get("path", "")))


def language_of_task(task: Task) -> str:
    """The task's language, by its path's extension."""
    from fimls.tools.tasks import language_of

    return language_of(task.path) or "other"
