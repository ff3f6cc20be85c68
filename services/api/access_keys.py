"""SageMaker-endpoint access keys: (access key id, secret) pairs, named and revocable.

SigV4 needs the secret itself on the server (the signature is an HMAC keyed by it), so a secret
cannot be stored as a one-way hash the way a password can: it lives in the environment or in a
file only the API's user can read (the API refuses a keys file that group or others may read).

Sources, read when the API is built:

* ``TRAINGUARD_SAGEMAKER_ACCESS_KEYS="AKID:SECRET,AKID2:SECRET2"`` (optionally ``name=AKID:SECRET``);
* ``TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE``: one ``[name=]AKID:SECRET`` per line, ``#`` comments.
  The file is re-read whenever its modification time changes, so deleting a line revokes that key
  without restarting the API.

A key's name (the key id when none is given) is who owns the jobs it creates (docs/tenancy.md):
a revoked key's jobs stay its name's, and a new key of the same name sees them again.

An access key id travels in clear in every request (``Credential=AKID/...``): it is an identifier,
not a secret, and it is never accepted as the API's bearer token.
"""

from __future__ import annotations

import re
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainguard.services.api.policy import OPERATOR

from trainguard.errors import ConfigError

__all__ = ["AccessKey", "AccessKeyStore", "parse_access_keys"]

# AWS key ids are 16-128 word characters; accept the same alphabet, a little shorter for hand-made ids.
_KEY_ID = re.compile(r"^[A-Za-z0-9_]{8,128}$")
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
_MIN_SECRET_LENGTH = 16


@dataclass(frozen=True)
class AccessKey:
    key_id: str
    secret: str
    name: str

    def __repr__(self) -> str:  # never print a secret, not even in a traceback
        return f"AccessKey(key_id={self.key_id!r}, name={self.name!r})"


def _parse_entry(entry: str, where: str) -> AccessKey:
    name, separator, pair = entry.partition("=")
    if not separator:
        name, pair = "", entry
    key_id, colon, secret = pair.partition(":")
    key_id, secret, name = key_id.strip(), secret.strip(), name.strip()
    if not colon or not key_id or not secret:
        raise ConfigError(f"{where}: expected [name=]ACCESS_KEY_ID:SECRET, got an entry without both parts")
    if not _KEY_ID.match(key_id):
        raise ConfigError(f"{where}: access key id {key_id!r} must be 8-128 letters, digits or '_'")
    if len(secret) < _MIN_SECRET_LENGTH:
        raise ConfigError(f"{where}: the secret of {key_id} is shorter than {_MIN_SECRET_LENGTH} characters")
    if name and not _NAME.match(name):
        raise ConfigError(f"{where}: key name {name!r} must be 1-64 letters, digits or . _ @ -")
    if (name or key_id) == OPERATOR:
        # Jobs are owned by key names; this one is the API token's, which sees every job.
        raise ConfigError(f"{where}: the key name {OPERATOR!r} is reserved for TRAINGUARD_API_TOKEN's jobs")
    return AccessKey(key_id=key_id, secret=secret, name=name or key_id)


def parse_access_keys(text: str, where: str, *, separators: str = ",\n") -> dict[str, AccessKey]:
    """``[name=]AKID:SECRET`` entries separated by commas or newlines; ``#`` starts a comment line."""
    keys: dict[str, AccessKey] = {}
    for line in text.splitlines() if "\n" in separators else [text]:
        if line.strip().startswith("#"):
            continue
        for entry in line.split(",") if "," in separators else [line]:
            if not entry.strip():
                continue
            key = _parse_entry(entry, where)
            if key.key_id in keys:
                raise ConfigError(f"{where}: access key id {key.key_id} is listed twice")
            keys[key.key_id] = key
    return keys


def _check_private(path: Path) -> None:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE {path} is readable by others (mode {stat.S_IMODE(mode):o}): "
            f"chmod 600 {path}"
        )


class AccessKeyStore:
    """Look up a secret by access key id; the keys file (if any) is re-read when it changes."""

    def __init__(self, inline: str = "", path: str | Path | None = None, *, forbidden_secrets: tuple[str, ...] = ()):
        self._inline = parse_access_keys(inline, "TRAINGUARD_SAGEMAKER_ACCESS_KEYS") if inline.strip() else {}
        self._path = Path(path) if path else None
        self._forbidden = tuple(s for s in forbidden_secrets if s)
        self._lock = threading.Lock()
        self._file_keys: dict[str, AccessKey] = {}
        self._file_stamp: tuple[int, int] | None = None
        if self._path is not None:
            self._reload()  # a missing or unreadable file is a configuration error at start
        self._check(self._inline)

    def _check(self, keys: dict[str, AccessKey]) -> None:
        for key in keys.values():
            if any(key.secret == f or key.key_id == f for f in self._forbidden):
                raise ConfigError(
                    f"access key {key.key_id}: neither the key id nor the secret may equal TRAINGUARD_API_TOKEN "
                    "(the key id travels in clear; the API token is a different credential)"
                )

    def _reload(self) -> None:
        assert self._path is not None
        try:
            info = self._path.stat()
        except OSError as error:
            raise ConfigError(f"TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE {self._path}: {error.strerror}") from None
        stamp = (info.st_mtime_ns, info.st_size)
        if stamp == self._file_stamp:
            return
        _check_private(self._path)
        keys = parse_access_keys(self._path.read_text(), f"TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE {self._path}")
        self._check(keys)
        self._file_keys, self._file_stamp = keys, stamp

    def _refresh(self) -> None:
        if self._path is not None:
            with self._lock:
                try:
                    self._reload()
                except (ConfigError, OSError):
                    # A broken edit of the file must not let anyone in: keep no file keys until fixed.
                    self._file_keys, self._file_stamp = {}, None

    def lookup(self, key_id: str) -> AccessKey | None:
        self._refresh()
        return self._inline.get(key_id) or self._file_keys.get(key_id)

    def has_name(self, name: str) -> bool:
        """Whether a key of this name is configured now: what a job created with it may still hold."""
        self._refresh()
        return any(key.name == name for key in (*self._inline.values(), *self._file_keys.values()))

    def __len__(self) -> int:
        return len(self._inline) + len(self._file_keys)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], api_token: str) -> AccessKeyStore:
        return cls(
            environ.get("TRAINGUARD_SAGEMAKER_ACCESS_KEYS", ""),
            environ.get("TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE") or None,
            forbidden_secrets=(api_token,),
        )


# -- managing a keys file: python -m trainguard.services.api.access_keys ---------------------------
def _new_key_id() -> str:
    import secrets

    return "AKTG" + secrets.token_hex(8).upper()


def _write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with a 0600 file (the running API re-reads it on change)."""
    import os
    import tempfile

    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(descriptor, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def create_key(path: Path, name: str) -> AccessKey:
    """Append a new named key pair to the keys file (created 0600 if missing); returns it."""
    import secrets

    text = path.read_text() if path.exists() else ""
    keys = parse_access_keys(text, str(path)) if text.strip() else {}
    if any(key.name == name for key in keys.values()):
        raise ConfigError(f"{path}: a key named {name!r} exists; revoke it first")
    key = _parse_entry(f"{name}={_new_key_id()}:{secrets.token_urlsafe(30)}", "new key")
    separator = "" if not text or text.endswith("\n") else "\n"
    _write_private(path, f"{text}{separator}{key.name}={key.key_id}:{key.secret}\n")
    return key


def revoke_key(path: Path, name_or_id: str) -> list[str]:
    """Remove every line whose key has this name or id; returns the removed key ids."""
    removed: list[str] = []
    kept: list[str] = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.strip().startswith("#"):
            key = _parse_entry(line, str(path))
            if name_or_id in (key.name, key.key_id):
                removed.append(key.key_id)
                continue
        kept.append(line)
    if not removed:
        raise ConfigError(f"{path}: no key named {name_or_id!r}")
    _write_private(path, "".join(f"{line}\n" for line in kept))
    return removed


def main(argv: list[str] | None = None) -> int:
    import argparse
    import os
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m trainguard.services.api.access_keys",
        description="Manage the SageMaker endpoint's keys file (TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE); "
        "a running API picks changes up at its next request.",
    )
    parser.add_argument("--file", default=os.environ.get("TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE"), required=False)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("create", help="add a named key pair; prints it once").add_argument("name")
    commands.add_parser("list", help="names and key ids (never secrets)")
    commands.add_parser("revoke", help="remove a key by name or key id").add_argument("key")
    args = parser.parse_args(argv)
    if not args.file:
        parser.error("--file or TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE is required")
    path = Path(args.file)
    try:
        if args.command == "create":
            key = create_key(path, args.name)
            print(f"AWS_ACCESS_KEY_ID={key.key_id}\nAWS_SECRET_ACCESS_KEY={key.secret}")
        elif args.command == "list":
            AccessKeyStore(path=path)  # refuses a file others may read
            for key in parse_access_keys(path.read_text(), str(path)).values():
                print(f"{key.name}\t{key.key_id}")
        else:
            print("revoked " + ", ".join(revoke_key(path, args.key)))
    except (ConfigError, OSError) as error:
        print(f"access_keys: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
