"""Documents fimls never reads: ``disabledGlobs``.

A matching document is not mirrored at all: the server keeps none of its text, so nothing
of it can reach a prompt (its own or another document's chunks), the engine host, the
latency log or idle prefill, and a request inside it has no document to complete.

A glob without ``/`` is matched against the file's name and each folder name on its path
(``.ssh`` covers ``~/.ssh/config``); a glob with ``/`` against the path relative to its
workspace folder (the whole path outside one), with ``**`` for any folders. Matching
ignores case: a secret named ``.ENV`` is still one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from fimls.crossfile.ignore import translate_glob
from fimls.documents import file_path, workspace_relative_path

# Environment files, keys and certificates, password stores, package-manager and cloud
# credentials, and folders of them: what a careful user expects never to leave.
DEFAULT_DISABLED_GLOBS = (
    ".env", ".env.*", "*.env", ".envrc", ".netrc", "_netrc", ".npmrc", ".pypirc", ".pgpass",
    ".htpasswd", ".git-credentials", ".ssh", ".aws", ".gnupg", ".docker", ".kube",
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "*.pem", "*.key", "*.p12", "*.pfx",
    "*.jks", "*.keystore", "*.crt", "*.cer", "*.der", "*.gpg", "*.asc", "*.kdbx",
    "*.ovpn", "*.tfvars", "*.tfstate", "*.tfstate.*", "secrets", "secrets.*", "*.secret",
    "*.secrets", "credentials", "credentials.*", "*.credentials", "service-account*.json",
)


@dataclass(frozen=True)
class DisabledGlobs:
    """The compiled ``disabledGlobs``."""

    names: tuple[re.Pattern[str], ...]
    paths: tuple[re.Pattern[str], ...]

    @classmethod
    def compile(cls, globs: Sequence[str]) -> DisabledGlobs:
        """Compile the option's globs (blank ones are skipped)."""
        names, paths = [], []
        for g in (g.strip() for g in globs):
            if not g:
                continue
            if "/" in g.strip("/"):
                paths.append(re.compile("^" + translate_glob(g.lstrip("/")) + "$", re.I))
            else:
                names.append(re.compile("^" + translate_glob(g.strip("/")) + "$", re.I))
        return cls(tuple(names), tuple(paths))

    def matches_path(self, path: str) -> bool:
        """Whether a ``/``-separated path (relative to its workspace, or absolute) is
        disabled."""
        parts = [p for p in PurePosixPath(path).parts if p != "/"]
        if any(rx.match(p) for p in parts for rx in self.names):
            return True
        rel = "/".join(parts)
        return any(rx.match(rel) for rx in self.paths)

    def matches(self, uri: str, roots: Sequence[str] = ()) -> bool:
        """Whether the document at ``uri`` is disabled; ``roots``: the workspace folders'
        URIs, for globs with ``/``."""
        return self.matches_path(uri_path(uri, roots))


def uri_path(uri: str, roots: Sequence[str] = ()) -> str:
    """The path globs see: relative to the workspace folder holding ``uri``, else the file's
    whole path (an ``untitled:`` buffer's is its name)."""
    repo, rel = workspace_relative_path(uri, list(roots))
    if repo is not None:
        return rel
    path = file_path(uri)
    return path if path is not None else rel
