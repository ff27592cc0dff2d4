"""A study's weights and checkpoints on S3-compatible object storage.

``artifacts="s3://bucket/prefix"``: trial weights are Optuna artifacts under
``prefix/weights/``, and each attempt's work folder (training checkpoint, derived
variants) is mirrored under ``prefix/checkpoints/ARCH_ID/TRIAL/`` as it is written, so
a worker on another machine, which never saw the first one's disk, resumes from it.
Endpoint and credentials come from the usual AWS settings (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, profiles).
Needs boto3: ``pip install 'autosearch-nas[s3]'``.
"""

from __future__ import annotations

import hashlib
import tempfile
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO

from autosearch.errors import ConfigError, PlatformError

__all__ = ["S3Folder", "is_s3"]

_INSTALL = "artifacts on S3 need boto3: pip install 'autosearch-nas[s3]'"


def is_s3(location: str | None) -> bool:
    return bool(location) and str(location).startswith("s3://")


class S3Folder:
    """``s3://bucket/prefix``: keys under the prefix, read and written whole."""

    def __init__(self, url: str) -> None:
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not bucket:
            raise ConfigError(f"artifacts URL {url!r} names no bucket; use s3://bucket/prefix")
        self.url, self.bucket, self.prefix = url, bucket, prefix.strip("/")

    @cached_property
    def client(self) -> Any:
        try:
            import boto3
        except ImportError:
            raise ConfigError(_INSTALL) from None
        return boto3.client("s3")

    def check(self) -> None:
        """Refuse, within seconds and in one line, a bucket that is missing or cannot be
        reached (before any worker starts, not at the end of a trial)."""
        from botocore.config import Config

        try:
            import boto3

            probe = boto3.client(
                "s3", config=Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 1})
            )
            probe.head_bucket(Bucket=self.bucket)
        except ImportError:
            raise ConfigError(_INSTALL) from None
        except Exception as exc:  # botocore's: no credentials, no bucket, no endpoint
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
            why = "it does not exist" if code in ("404", "NoSuchBucket") else str(exc)
            raise PlatformError(
                f"artifacts {self.url}: bucket {self.bucket!r} cannot be used ({why}); create "
                "it, or check AWS_ENDPOINT_URL and the credentials"
            ) from None

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def cache(self, study: str = "") -> Path:
        """This machine's folder for the attempts' work (the bucket holds the copy that
        counts): one per URL and ``study`` (the study's creation id), so that a study
        made again at the same URL never resumes another's leftover work."""
        key = f"{self.url}\n{study}" if study else self.url  # a study of before: the URL
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / "autosearch-s3" / digest

    def put(self, path: Path, relative: str) -> None:
        self.client.upload_file(str(path), self.bucket, self.key(relative))

    def get(self, relative: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.client.download_file(self.bucket, self.key(relative), str(path))

    def list(self, relative: str) -> list[str]:
        """The keys under ``relative``, as paths relative to the prefix."""
        start = self.key(relative).rstrip("/") + "/"
        found: list[str] = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=start
        )
        for page in pages:
            found += [item["Key"] for item in page.get("Contents", [])]
        cut = len(self.key(""))
        return [key[cut:] for key in found]

    def delete(self, relative: str) -> None:
        """Every key under ``relative``."""
        keys = [{"Key": self.key(k)} for k in self.list(relative)]
        for i in range(0, len(keys), 1000):  # the API's batch limit
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys[i : i + 1000]})

    def artifact_store(self) -> _PrefixedStore:
        from optuna.artifacts import Boto3ArtifactStore

        return _PrefixedStore(
            Boto3ArtifactStore(self.bucket, client=self.client), self.key("weights")
        )


class _PrefixedStore:
    """Optuna's Boto3ArtifactStore with its artifacts under a key prefix."""

    def __init__(self, store: Any, prefix: str) -> None:
        self.store, self.prefix = store, prefix

    def open_reader(self, artifact_id: str) -> BinaryIO:
        return self.store.open_reader(f"{self.prefix}/{artifact_id}")  # type: ignore[no-any-return]

    def write(self, artifact_id: str, content_body: BinaryIO) -> None:
        self.store.write(f"{self.prefix}/{artifact_id}", content_body)

    def remove(self, artifact_id: str) -> None:
        self.store.remove(f"{self.prefix}/{artifact_id}")
