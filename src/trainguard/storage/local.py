"""A run in a local directory."""

from __future__ import annotations

import builtins
import errno
import mmap
import os
from collections.abc import Sequence
from pathlib import Path

from trainguard.errors import ObjectNotFound, StorageError
from trainguard.storage.base import Buffer

__all__ = ["LocalStore"]


class _LocalWriter:
    """Streams into a hidden temp file beside the target; rename on commit makes it visible."""

    def __init__(self, store: LocalStore, key: str) -> None:
        self._final = store.path_of(key)
        self._temp = self._final.with_name(f".{self._final.name}.{os.getpid()}.tmp")
        try:
            self._final.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self._temp, "wb")  # noqa: SIM115 - closed in commit/abort
        except OSError as error:
            raise _storage_error("create", self._final, error) from error

    def write(self, data: Buffer) -> None:
        try:
            self._file.write(data)
        except OSError as error:
            self.abort()
            raise _storage_error("write", self._final, error) from error

    def commit(self) -> None:
        try:
            self._file.close()
            os.replace(self._temp, self._final)
        except OSError as error:
            self.abort()
            raise _storage_error("write", self._final, error) from error

    def abort(self) -> None:
        try:
            self._file.close()
        finally:
            try:
                os.unlink(self._temp)
            except FileNotFoundError:
                pass


def _storage_error(action: str, path: Path, error: OSError | ValueError) -> StorageError:
    # mmap raises ValueError (no errno) for a file it cannot map, OSError for the rest.
    code = error.errno if isinstance(error, OSError) else None
    if code == errno.ENOSPC:
        reason = "the disk is full; free space or point out_dir at a larger disk"
    elif code == errno.EROFS:
        reason = "the file system is read-only (was it remounted read-only?); choose a writable out_dir"
    elif code in (errno.EACCES, errno.EPERM):
        reason = "permission denied; choose a writable out_dir"
    else:
        reason = (error.strerror if isinstance(error, OSError) else None) or str(error)
    return StorageError(f"cannot {action} {path}: {reason}")


class LocalStore:
    """Objects as files under ``root``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().absolute()

    @property
    def url(self) -> str:
        return str(self.root)

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def path_of(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    def open_writer(self, key: str) -> _LocalWriter:
        return _LocalWriter(self, key)

    def write(self, key: str, data: Buffer | Sequence[Buffer]) -> None:
        writer = self.open_writer(key)
        for part in [data] if isinstance(data, (bytes, bytearray, memoryview)) else data:
            writer.write(part)
        writer.commit()

    def read(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        path = self.path_of(key)
        try:
            with open(path, "rb") as file:
                if start:
                    file.seek(start)
                return file.read() if length is None else file.read(length)
        except FileNotFoundError:
            raise ObjectNotFound(f"{path} does not exist") from None
        except OSError as error:
            raise _storage_error("read", path, error) from error

    def read_mapped(self, key: str) -> memoryview:
        """A whole file mapped read-only: the page cache's own pages, no copy.

        For files that are complete and never rewritten in place (event files behind an index:
        writers publish them by rename). A reader that needs most of a large file (the rules
        read every tensor of every step) saves copying it into fresh memory.
        """
        path = self.path_of(key)
        try:
            with open(path, "rb") as file:
                if os.fstat(file.fileno()).st_size == 0:
                    return memoryview(b"")
                return memoryview(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ))
        except FileNotFoundError:
            raise ObjectNotFound(f"{path} does not exist") from None
        except (OSError, ValueError) as error:
            raise _storage_error("read", path, error) from error

    def exists(self, key: str) -> bool:
        return self.path_of(key).exists()

    def size(self, key: str) -> int:
        try:
            return self.path_of(key).stat().st_size
        except FileNotFoundError:
            raise ObjectNotFound(f"{self.path_of(key)} does not exist") from None

    def delete(self, key: str) -> None:
        try:
            self.path_of(key).unlink()
        except FileNotFoundError:
            pass

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        # Walk sorted and prune whole directories that sort before start_after, so following a
        # live run costs a walk of the newest directories only, not a full rescan.
        base, _, name_prefix = prefix.rpartition("/")
        base_key = f"{base}/" if base else ""
        keys: list[str] = []
        self._walk(self.path_of(base) if base else self.root, base_key, name_prefix, start_after, keys)
        return keys

    def _walk(
        self, directory: Path, key_prefix: str, name_prefix: str, start_after: str | None, out: builtins.list[str]
    ) -> None:
        try:
            # Directories sort as "name/" so the walk yields keys in byte order, like S3.
            entries = sorted(
                os.scandir(directory), key=lambda entry: entry.name + "/" if entry.is_dir() else entry.name
            )
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            name = entry.name
            if name.startswith(".") or not name.startswith(name_prefix):
                continue
            key = key_prefix + name
            if entry.is_dir():
                sub = key + "/"
                if start_after is not None and sub < start_after and not start_after.startswith(sub):
                    continue
                self._walk(Path(entry.path), sub, "", start_after, out)
            elif start_after is None or key > start_after:
                out.append(key)
