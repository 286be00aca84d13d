"""Secret redaction: API keys never reach results, logs, fingerprints or MLflow."""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

SECRET_NAME = re.compile(r"(TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
SECRET_FLAGS = {"--api-key", "--admin-api-key", "--hf-token", "--token"}
MASK = "***"
API_KEY_FLAG = "--api-key"  # the one secret flag specsweep writes itself (from api_key_env) and puts back at launch
# A field or flag name holds a secret when one of its words is one of these (api_key, admin_api_key,
# ssl_keyfile_password, watermark_key_b, ...) or its last word is a token word (hf_token; not max_total_tokens,
# speculative_num_draft_tokens or speculative_token_map, which are figures an analysis needs).
SECRET_WORDS = frozenset(
    {"key", "keys", "apikey", "secret", "secrets", "password", "passwd", "credential", "credentials"}
)
SECRET_LAST_WORDS = frozenset({"token", "auth", "authorization", "cookie"})
# `--flag value` or `--flag=value` inside a text (a launch command), the value quoted or bare
FLAG_IN_TEXT = re.compile(
    r"(?P<flag>--[A-Za-z0-9][\w.-]*)(?P<sep>=|\s+)(?P<value>(?!--)(?:\"[^\"]*\"|'[^']*'|[^\s\"']+))"
)
# the password of a URI's userinfo (`http://user:pw@host`), wherever such a URI appears in a text
URI_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*):(?P<password>[^/@\s]+)@")


class MissingAPIKey(ValueError):
    """A config names an API-key variable that is not set; the message names it and the fix."""


def api_key_from_env(name: str | None) -> str | None:
    """The API key held by the environment variable `name` (the one place that reads it); None without a name.

    The value is only ever sent to a server (`--api-key`, `Authorization: Bearer`), never stored."""
    if not name:
        return None
    value = os.environ.get(name)
    if not value:
        raise MissingAPIKey(
            f"the API key variable {name} (api_key_env / --api-key-env) is not set; export {name}=<key> before "
            "running, or remove api_key_env from the variant"
        )
    return value


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def is_secret_key(name: str) -> bool:
    """Whether a field or flag name (`api_key`, `--admin-api-key`) can hold a secret, by its words."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    return bool(set(words) & SECRET_WORDS) or (bool(words) and words[-1] in SECRET_LAST_WORDS)


def is_secret_flag(arg: str) -> bool:
    return arg in SECRET_FLAGS or (arg.startswith("--") and is_secret_key(arg))


def redact_command_text(text: str) -> str:
    """A command line held as one text (SGLang's `launch_command`) with every secret flag's value masked,
    then `redact_text` (secret values from the environment, URI passwords)."""

    def mask(m: re.Match[str]) -> str:
        if is_secret_flag(m["flag"]):
            return f"{m['flag']}{m['sep']}{MASK}"
        return m.group(0)

    return redact_text(FLAG_IN_TEXT.sub(mask, text))


def redact_facts(obj: Any) -> Any:
    """A server's facts (SGLang's /server_info payload, any JSON) with every secret masked, before anything
    stores them: the value of every key that can hold a secret (`is_secret_key`; None, "" and False are kept,
    they say there is none), secret flags inside texts (`launch_command`), and secret values from the
    environment."""
    if isinstance(obj, dict):
        return {
            k: (MASK if is_secret_key(str(k)) and obj[k] not in (None, "", False) else redact_facts(obj[k]))
            for k in obj
        }
    if isinstance(obj, list | tuple):
        return [redact_facts(v) for v in obj]
    if isinstance(obj, str):
        return redact_command_text(obj)
    return obj


def redact_argv(argv: list[str]) -> list[str]:
    """Mask the values of secret-bearing flags (`--api-key X` and `--api-key=X`)."""
    out: list[str] = []
    mask_next = False
    for a in argv:
        if mask_next and not a.startswith("--"):
            out.append(MASK)
            mask_next = False
        elif is_secret_flag(a):
            out.append(a)
            mask_next = True
        elif "=" in a and is_secret_flag(a.split("=", 1)[0]):
            out.append(a.split("=", 1)[0] + "=" + MASK)
        else:
            out.append(a)
            mask_next = False
    return [redact_text(a) for a in out]


def secret_values() -> list[str]:
    """Values of secret-looking environment variables currently set (long enough to be worth masking)."""
    return [v for k, v in os.environ.items() if is_secret_name(k) and len(v) >= 6]


def redact_text(text: str) -> str:
    """Replace every secret value found in the environment, and every password embedded in a URI, by the mask."""
    for value in secret_values():
        text = text.replace(value, MASK)
    return redact_uri(text)


def redact_uri(text: str) -> str:
    """`http://user:pw@host/...` -> `http://user:***@host/...` (in a URI or any text holding one)."""
    return URI_PASSWORD.sub(lambda m: f"{m['head']}:{MASK}@", text)


def split_uri_credentials(uri: str) -> tuple[str, str | None, str | None]:
    """(the URI without its userinfo, user name, password); the last two None when it carries none.

    Why: a credential inside a URI travels wherever the URI does (rule params that Snakemake prints, marker
    files, log lines); split off, it can be handed on the way MLflow takes it, in environment variables."""
    parts = urlsplit(uri)
    if not parts.scheme or "@" not in parts.netloc:
        return uri, None, None
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, _, password = userinfo.partition(":")
    bare = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return bare, unquote(user) or None, unquote(password) or None


def safe_environ(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment without secret-looking variables, for fingerprints."""
    env = dict(os.environ if env is None else env)
    return {k: v for k, v in env.items() if not is_secret_name(k)}


def unredact_argv(argv: list[str], secret_env: tuple[str, ...] | list[str]) -> list[str]:
    """Put the API key back (from the environment, at launch time) where `--api-key`'s value is masked."""
    if not secret_env:
        return list(argv)
    value = os.environ.get(secret_env[0])
    if not value:
        raise RuntimeError(f"environment variable {secret_env[0]} (the server's API key) is not set")
    out = list(argv)
    for i, a in enumerate(out):
        if a == MASK and i > 0 and out[i - 1] == API_KEY_FLAG:
            out[i] = value
        elif a == f"{API_KEY_FLAG}={MASK}":
            out[i] = a.split("=", 1)[0] + "=" + value
    return out
