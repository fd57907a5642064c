"""What fimls never reads from a workspace: files git ignores and files that look like
secrets. Plain functions over paths; the only files read are ``.gitignore`` files and
``.git/info/exclude``.

The ``.gitignore`` rules followed are git's, minus what a code completer has no need of:
comments, blank lines, ``!`` negation, a trailing ``/`` (directories only), a leading or
inner ``/`` (anchored to the ``.gitignore``'s folder), ``*``, ``?``, ``[...]`` and ``**``.
An ignored folder ignores everything under it, as in git (a negation cannot re-include a
file whose folder is ignored).
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path

# Names (of a file or of any folder above it) never read: keys, credentials, environment
# files, package-manager and shell credentials.
_SECRET_NAMES = re.compile(
    r"^(?:\.env(?:\..*)?|.*\.env|\.netrc|\.npmrc|\.pypirc|\.pgpass|\.htpasswd|\.git-credentials"
    r"|\.ssh|\.aws|\.gnupg|\.docker|id_(?:rsa|dsa|ecdsa|ed25519)(?:\.pub)?"
    r"|.*\.(?:pem|key|p12|pfx|jks|keystore|crt|cer|der|asc|gpg|kdbx|ovpn)"
    r"|.*(?:secret|credential|password|passwd|private[_-]?key).*)$", re.I)


def looks_secret(rel: str) -> bool:
    """Whether a workspace-relative path names something that may hold a secret."""
    return any(_SECRET_NAMES.match(part) for part in Path(rel).parts)


@dataclass(frozen=True)
class _Rule:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


def translate_glob(pattern: str) -> str:
    """A gitignore glob (already stripped of ``!``, the trailing ``/`` and the anchoring
    ``/``) as a regular expression over a ``/``-separated relative path."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape("["))
                i += 1
            else:
                out.append(fnmatch.translate(pattern[i:end + 1])[4:-3])
                i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def parse_rules(text: str) -> list[_Rule]:
    """The rules of one ``.gitignore`` file, in order."""
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip() if not raw.endswith("\\ ") else raw
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line[1:] if negate else line.removeprefix("\\")
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        body = translate_glob(line.lstrip("/"))
        regex = re.compile(("^" if anchored else "^(?:.*/)?") + body + "$")
        rules.append(_Rule(regex, negate, dir_only))
    return rules


@dataclass
class GitIgnore:
    """The ignore rules of one workspace folder, read once per ``.gitignore`` file."""

    root: Path
    _rules: dict[Path, list[_Rule]] = field(default_factory=dict)

    def _rules_in(self, folder: Path) -> list[_Rule]:
        if folder not in self._rules:
            rules: list[_Rule] = []
            names = [".gitignore"] if folder != self.root else [".git/info/exclude",
                                                                 ".gitignore"]
            for name in names:
                with contextlib.suppress(OSError):
                    rules += parse_rules((folder / name).read_text(encoding="utf-8",
                                                                   errors="replace"))
            self._rules[folder] = rules
        return self._rules[folder]

    def _match(self, rel: Path, is_dir: bool) -> bool:
        """Whether ``rel`` itself (not its folders) is ignored."""
        ignored = False
        for depth in range(len(rel.parts)):
            folder = self.root.joinpath(*rel.parts[:depth])
            sub = "/".join(rel.parts[depth:])
            for rule in self._rules_in(folder):
                if (not rule.dir_only or is_dir) and rule.regex.match(sub):
                    ignored = not rule.negate
        return ignored

    def ignored(self, rel: Path) -> bool:
        """Whether git ignores ``rel`` (relative to the root), a file, or any folder above
        it; ``.git`` itself always."""
        if rel.parts and rel.parts[0] == ".git":
            return True
        for depth in range(1, len(rel.parts)):
            if self._match(Path(*rel.parts[:depth]), True):
                return True
        return self._match(rel, False)
