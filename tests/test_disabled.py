"""disabledGlobs: which documents fimls never reads (golden cases), and the option."""

from __future__ import annotations

import pytest

from fimls.config import Options, apply_dict
from fimls.disabled import DEFAULT_DISABLED_GLOBS, DisabledGlobs, uri_path

ROOT = "file:///home/u/proj"
DEFAULT = DisabledGlobs.compile(DEFAULT_DISABLED_GLOBS)


@pytest.mark.parametrize("uri", [
    f"{ROOT}/.env", f"{ROOT}/.env.local", f"{ROOT}/config/prod.env", f"{ROOT}/.ENV",
    f"{ROOT}/certs/server.pem", f"{ROOT}/tls/server.key", "file:///home/u/.ssh/id_ed25519",
    "file:///home/u/.ssh/config", "file:///home/u/.netrc", f"{ROOT}/.npmrc",
    f"{ROOT}/.pypirc", f"{ROOT}/store.kdbx", f"{ROOT}/cert.p12", f"{ROOT}/secrets/db.yaml",
    f"{ROOT}/deploy/secrets.yml", f"{ROOT}/infra/terraform.tfvars", "file:///home/u/.aws/credentials",
    f"{ROOT}/gcp/service-account-prod.json", f"{ROOT}/.git-credentials",
])
def test_the_default_keeps_secrets_out(uri: str) -> None:
    assert DEFAULT.matches(uri, [ROOT])


@pytest.mark.parametrize("uri", [
    f"{ROOT}/app.py", f"{ROOT}/environment.py", f"{ROOT}/src/env.ts", f"{ROOT}/keys.go",
    f"{ROOT}/docs/secrets-management.md", f"{ROOT}/README.md", "untitled:Untitled-1",
    f"{ROOT}/src/credentials_form.tsx",
])
def test_the_default_leaves_code_alone(uri: str) -> None:
    assert not DEFAULT.matches(uri, [ROOT])


def test_globs_with_a_slash_match_the_workspace_path() -> None:
    globs = DisabledGlobs.compile(["vendor/**", "**/generated/*.ts", "/build"])
    assert globs.matches(f"{ROOT}/vendor/lib/a.py", [ROOT])
    assert globs.matches(f"{ROOT}/src/generated/api.ts", [ROOT])
    assert globs.matches(f"{ROOT}/generated/api.ts", [ROOT])
    assert not globs.matches(f"{ROOT}/src/generated/deep/api.ts", [ROOT])
    assert not globs.matches(f"{ROOT}/src/vendor/a.py", [ROOT])
    assert globs.matches(f"{ROOT}/build", [ROOT])


def test_outside_the_workspace_the_whole_path_counts() -> None:
    assert uri_path("file:///etc/ssl/private/x.py") == "/etc/ssl/private/x.py"
    assert uri_path(f"{ROOT}/a/b.py", [ROOT]) == "a/b.py"
    assert DisabledGlobs.compile(["private"]).matches("file:///etc/ssl/private/x.py")


def test_the_option_takes_a_list_or_a_comma_separated_string() -> None:
    assert Options().completion.disabled_globs == DEFAULT_DISABLED_GLOBS
    opts, errors = apply_dict(Options(), {"disabledGlobs": ["*.secret", " vendor/** "]})
    assert (opts.completion.disabled_globs, errors) == (("*.secret", "vendor/**"), [])
    opts, errors = apply_dict(Options(), {"disabledGlobs": ".env,*.pem"})
    assert opts.completion.disabled_globs == (".env", "*.pem")
    opts, errors = apply_dict(Options(), {"disabledGlobs": []})
    assert opts.completion.disabled_globs == ()
    opts, errors = apply_dict(Options(), {"disabledGlobs": [1]})
    assert opts.completion.disabled_globs == DEFAULT_DISABLED_GLOBS and len(errors) == 1
