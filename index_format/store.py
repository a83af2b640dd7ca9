"""One store layer: the bytes of an index root, in a local folder or in object storage.

A root is named by a path (``indexes/scifact``) or a URL (``s3://bucket/prefix``; ``gs://`` and ``az://``
work the same way). Object storage goes through obstore (the Python binding of Rust's ``object_store``,
the crate behind Delta Lake's and DataFusion's I/O). It was chosen over ``pyarrow.fs`` and s3fs because it
has conditional writes (``If-None-Match``, ``If-Match``), which a compare-and-swap of ``ACTIVE`` needs and
neither of the others offers, streams large files with concurrent multipart uploads, and brings no
dependencies. Endpoint and credentials come from the standard variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``), so any S3-compatible store works;
a plain-``http://`` endpoint (a local S3 server) is allowed as named.

Keys are ``/``-separated paths under the root. Every write is atomic (a reader sees the old bytes or the
new, never a part), and ``put_if`` is the one conditional write: compare-and-swap on a tag that ``get_tagged``
returned (an ETag in object storage, a digest of the bytes in a folder), or create-if-absent with ``None``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

REMOTE_SCHEMES = ("s3://", "gs://", "az://", "abfs://")


class StoreError(RuntimeError):
    """A store that cannot be read or written (unreachable endpoint, no such bucket, denied)."""


class Conflict(StoreError):
    """A conditional write lost: the key changed (or appeared) since it was read."""


def is_remote(root: str | Path) -> bool:
    return str(root).startswith(REMOTE_SCHEMES)


def open_store(root: str | Path) -> Store:
    """The store of a root: object storage for a URL, a folder otherwise."""
    return ObjectStore(str(root)) if is_remote(root) else FolderStore(Path(root))


class Store:
    """What the index needs of a place that holds bytes. Missing keys: ``get`` raises ``FileNotFoundError``,
    ``get_tagged`` returns ``(None, None)``."""

    url: str

    def get(self, key: str) -> bytes: ...
    def get_tagged(self, key: str) -> tuple[bytes | None, str | None]: ...
    def put(self, key: str, data: bytes, durable: bool = True) -> None:
        """Write ``data`` at ``key`` atomically; ``durable`` False: a scratch file a rerun makes again, which a folder
        need not flush to disk before answering."""
        ...

    def put_if(self, key: str, data: bytes, tag: str | None) -> str: ...
    def exists(self, key: str) -> bool: ...
    def list(self, prefix: str = "", offset: str | None = None) -> dict[str, int]:
        """Key -> size of the keys under ``prefix`` (past ``offset``, when given: the keys that sort after it)."""
        ...

    def modified(self, prefix: str) -> dict[str, float]:
        """Key -> the time of its last write, on the store's clock (seconds since the epoch), of the keys under
        ``prefix`` (a folder-like prefix: ``leases/version/``)."""
        ...

    def upload(self, path: Path, key: str) -> None: ...
    def download(self, key: str, path: Path) -> None: ...
    def delete(self, keys: list[str]) -> None: ...

    def open(self, key: str) -> BinaryIO:
        """The key's bytes as a seekable binary file (read, readline, seek, tell), read as they are asked for:
        a task reads its byte range of a large object without fetching the rest."""
        ...

    def text(self, key: str) -> str | None:
        """The key's bytes as text, or None when it does not exist."""
        data, _ = self.get_tagged(key)
        return None if data is None else data.decode()


class FolderStore(Store):
    """A root on a local (or mounted) disk. ``put_if`` serialises writers with an flock beside the key."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.url = str(self.folder)

    def _path(self, key: str) -> Path:
        return self.folder / key

    def get(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def get_tagged(self, key: str) -> tuple[bytes | None, str | None]:
        try:
            data = self.get(key)
        except FileNotFoundError:
            return None, None
        return data, hashlib.sha256(data).hexdigest()

    def put(self, key: str, data: bytes, durable: bool = True) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        with self._locked(key):
            _, current = self.get_tagged(key)
            if current != tag:
                raise Conflict(f"{self._path(key)} changed since it was read")
            self.put(key, data)
        return hashlib.sha256(data).hexdigest()

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "", offset: str | None = None) -> dict[str, int]:
        base = self._path(prefix) if prefix else self.folder
        if base.is_file():
            return {prefix: base.stat().st_size}
        out = {}
        for folder, _, files in os.walk(base):
            for name in files:
                key = (Path(folder) / name).relative_to(self.folder).as_posix()
                if offset is None or key > offset:
                    out[key] = (Path(folder) / name).stat().st_size
        return dict(sorted(out.items()))

    def modified(self, prefix: str) -> dict[str, float]:
        out = {}
        for folder, _, files in os.walk(self._path(prefix)):
            for name in files:
                path = Path(folder) / name
                with contextlib.suppress(FileNotFoundError):  # deleted since the walk listed it
                    out[path.relative_to(self.folder).as_posix()] = path.stat().st_mtime
        return out

    def upload(self, path: Path, key: str) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        shutil.copyfile(path, tmp)
        os.replace(tmp, target)

    def download(self, key: str, path: Path) -> None:
        shutil.copyfile(self._path(key), path)

    def open(self, key: str) -> BinaryIO:
        return open(self._path(key), "rb")  # noqa: SIM115 (the caller closes it)

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)


class ObjectStore(Store):
    """A root in object storage (``s3://bucket/prefix``), through obstore."""

    def __init__(self, url: str):
        from obstore.store import from_url

        self.url = url.rstrip("/")
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3") or ""
        # Fail in seconds, not minutes, when the endpoint does not answer: a start or a publish says so at once.
        options = {"connect_timeout": "5s", "timeout": "120s", "allow_http": endpoint.startswith("http://")}
        retry = {"max_retries": 3, "retry_timeout": timedelta(seconds=30)}
        try:
            self.store = from_url(self.url, client_options=options, retry_config=retry)
        except Exception as e:  # a malformed URL or configuration: obstore raises its own types
            raise StoreError(f"{self.url}: {_first_line(e)}") from None

    def _call(self, what: str, key: str, fn, *args, **kwargs):
        """Run one obstore call; its errors become FileNotFoundError, Conflict or StoreError with one line."""
        from obstore.exceptions import AlreadyExistsError, NotFoundError, PreconditionError

        try:
            return fn(self.store, *args, **kwargs)
        except (NotFoundError, FileNotFoundError):
            raise FileNotFoundError(f"{self.url}/{key}: no such key") from None
        except (AlreadyExistsError, PreconditionError):
            raise Conflict(f"{self.url}/{key} changed since it was read") from None
        except Exception as e:
            raise StoreError(f"cannot {what} {self.url}/{key}: {_first_line(e)}") from None

    def get(self, key: str) -> bytes:
        import obstore

        return bytes(self._call("read", key, lambda s: obstore.get(s, key).bytes()))

    def get_tagged(self, key: str) -> tuple[bytes | None, str | None]:
        import obstore

        def read(store):
            result = obstore.get(store, key)
            return bytes(result.bytes()), result.meta.get("e_tag")

        try:
            return self._call("read", key, read)
        except FileNotFoundError:
            return None, None

    def put(self, key: str, data: bytes, durable: bool = True) -> None:
        import obstore

        self._call("write", key, obstore.put, key, data)

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        import obstore

        mode = "create" if tag is None else {"e_tag": tag}
        return self._call("write", key, obstore.put, key, data, mode=mode)["e_tag"]

    def exists(self, key: str) -> bool:
        import obstore

        try:
            self._call("read", key, obstore.head, key)
        except FileNotFoundError:
            return False
        return True

    def list(self, prefix: str = "", offset: str | None = None) -> dict[str, int]:
        import obstore

        def listing(store):
            out = {}
            for batch in obstore.list(store, prefix or None, offset=offset):
                for meta in batch:
                    out[meta["path"]] = int(meta["size"])
            return out

        return dict(sorted(self._call("list", prefix, listing).items()))

    def modified(self, prefix: str) -> dict[str, float]:
        import obstore

        def listing(store):
            return {meta["path"]: meta["last_modified"].timestamp()
                    for batch in obstore.list(store, prefix or None) for meta in batch}

        return self._call("list", prefix, listing)

    def upload(self, path: Path, key: str) -> None:
        import obstore

        self._call("write", key, obstore.put, key, Path(path))

    def download(self, key: str, path: Path) -> None:
        import obstore

        def fetch(store):
            with open(path, "wb") as f:
                for chunk in obstore.get(store, key).stream(min_chunk_size=8 << 20):
                    f.write(chunk)

        self._call("read", key, fetch)

    def open(self, key: str) -> BinaryIO:
        import obstore

        return _Reader(self._call("read", key, obstore.open_reader, key, buffer_size=8 << 20))

    def delete(self, keys: list[str]) -> None:
        import obstore

        for start in range(0, len(keys), 1000):
            self._call("delete", keys[start] if keys else "", obstore.delete, keys[start:start + 1000])


class _Reader(io.RawIOBase):
    """obstore's buffered reader as a Python binary file (its reads are ``bytes``, as pyarrow and ``json`` expect)."""

    def __init__(self, inner):
        self.inner = inner

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        return bytes(self.inner.read(None if size is None or size < 0 else size))

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def readline(self, size: int = -1) -> bytes:
        return bytes(self.inner.readline())

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.inner.seek(offset, whence)

    def tell(self) -> int:
        return self.inner.tell()

    def close(self) -> None:
        self.inner.close()
        super().close()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def fsync_dir(folder: Path) -> None:
    """Make a folder's entries (a new or renamed file's name) durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
