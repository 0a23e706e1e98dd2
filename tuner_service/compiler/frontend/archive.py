"""A model with external data as one upload: a zip or tar (.tar, .tar.gz, .tar.bz2, .tar.xz)
archive holding one ``.onnx`` file and the data files it names.

The archive is untrusted. Members are read into memory (nothing is written to disk, so a member
name can never land outside a folder), with the same path rules as external data locations, no
links or devices, at most ``max_members`` entries and ``max_bytes`` uncompressed bytes in all,
counted while decompressing (a zip bomb stops at the limit, whatever the headers claim).
``pack_model`` makes such an archive from a model on disk (``tuner submit``).
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import io
import logging
import lzma
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from tuner_service.compiler.frontend.errors import ModelError, ModelTooLarge
from tuner_service.compiler.frontend.external import MemoryFiles, check_location

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20
# Errors of the decompressors and archive readers on a corrupt or hostile archive.
_ARCHIVE_ERRORS: tuple[type[Exception], ...] = (
    zipfile.BadZipFile, tarfile.TarError, zlib.error, lzma.LZMAError, EOFError, OSError,
    NotImplementedError, RuntimeError, ValueError,
)


@dataclasses.dataclass(frozen=True)
class ArchiveLimits:
    max_bytes: int  # uncompressed bytes of all members together
    max_members: int  # entries, directories included


#: limits for an archive on the user's own disk (``tuner extract model.zip``): still bounded,
#: so a mistaken or hostile file cannot exhaust memory
LOCAL_LIMITS = ArchiveLimits(max_bytes=2 << 30, max_members=4096)


@dataclasses.dataclass(frozen=True)
class ModelArchive:
    """The ``.onnx`` member and the other files, named relative to the ``.onnx``'s folder."""

    name: str
    model: bytes
    files: MemoryFiles


class _TooLarge(Exception):
    pass


def is_archive(data: bytes) -> bool:
    """Zip, gzip, bzip2, xz or plain tar, judged by content (an ONNX file is none of them)."""
    return (data[:4] == b"PK\x03\x04" or data[:2] == b"\x1f\x8b" or data[:3] == b"BZh"
            or data[:6] == b"\xfd7zXZ\x00" or data[257:262] == b"ustar")


def read_archive(data: bytes, limits: ArchiveLimits) -> ModelArchive:
    """The model and its data files, or ModelError saying which rule the archive breaks."""
    try:
        members = dict(_zip_members(data, limits) if data[:4] == b"PK\x03\x04"
                       else _tar_members(data, limits))
    except _TooLarge as e:
        raise ModelTooLarge(f"the archive unpacks to more than the {limits.max_bytes}-byte "
                         f"limit{e}") from None
    except ModelError:
        raise
    except _ARCHIVE_ERRORS as e:
        raise ModelError(f"cannot read the archive: {e}") from e
    models = [name for name in members if name.lower().endswith(".onnx")]
    if len(models) != 1:
        found = ", ".join(models) if models else "none"
        raise ModelError(f"the archive must hold exactly one .onnx file, it holds {found}")
    name = models[0]
    folder = name.rpartition("/")[0]
    prefix = f"{folder}/" if folder else ""
    files = {member[len(prefix):]: content for member, content in members.items()
             if member != name and member.startswith(prefix)}
    logger.debug("archive: model %s with %d data files", name, len(files))
    return ModelArchive(name, members[name], MemoryFiles(files, "the archive"))


def _zip_members(data: bytes, limits: ArchiveLimits) -> Iterator[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        infos = archive.infolist()
        _count(len(infos), limits)
        counter = _Counter(limits.max_bytes)
        seen: set[str] = set()
        for info in infos:
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise ModelError(f"archive member {info.filename!r} is a symbolic link; "
                                 "links are not allowed")
            name = _member_name(info.filename, seen)
            if name is None or info.is_dir():
                continue
            with archive.open(info) as stream:
                yield name, counter.read_all(stream, name)


def _tar_members(data: bytes, limits: ArchiveLimits) -> Iterator[tuple[str, bytes]]:
    counter = _Counter(limits.max_bytes)
    seen: set[str] = set()
    with _decompressed(data) as raw:
        # Every decompressed byte, tar headers included, counts against the limit.
        stream = _LimitedReader(raw, limits.max_bytes + 64 * 1024)
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for count, member in enumerate(archive, start=1):
                _count(count, limits)
                name = _tar_member_name(member, seen)
                if name is None:
                    continue
                content = archive.extractfile(member)
                if content is None:
                    raise ModelError(f"archive member {member.name!r} has no content")
                yield name, counter.read_all(content, name)


def _decompressed(data: bytes) -> io.BufferedIOBase:
    raw = io.BytesIO(data)
    if data[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw)
    if data[:3] == b"BZh":
        return bz2.BZ2File(raw)
    if data[:6] == b"\xfd7zXZ\x00":
        return lzma.LZMAFile(raw)
    return raw


def _tar_member_name(member: tarfile.TarInfo, seen: set[str]) -> str | None:
    if not (member.isreg() or member.isdir()):
        kind = "a link" if member.issym() or member.islnk() else "not a regular file"
        raise ModelError(f"archive member {member.name!r} is {kind}; only files and folders "
                         "are allowed")
    name = _member_name(member.name, seen)
    return None if member.isdir() else name


def _count(count: int, limits: ArchiveLimits) -> None:
    if count > limits.max_members:
        raise ModelTooLarge(f"the archive has more than {limits.max_members} members")


def _member_name(raw: str, seen: set[str]) -> str | None:
    """The checked member name; None for folders and macOS metadata (``__MACOSX/``, ``._x``)."""
    text = raw[2:] if raw.startswith("./") else raw
    if text.endswith("/") or text in ("", "."):
        return None
    try:
        name = check_location(text)
    except ModelError as e:
        raise ModelError(f"archive member {raw!r} is not allowed: {e}") from None
    parts = name.split("/")
    if parts[0] == "__MACOSX" or parts[-1].startswith("._"):
        return None
    if name in seen:
        raise ModelError(f"archive member {name!r} appears twice")
    seen.add(name)
    return name


class _Counter:
    """Reads members in chunks and stops once their total passes the limit."""

    def __init__(self, limit: int) -> None:
        self.left = limit

    def read_all(self, stream: IO[bytes], name: str) -> bytes:
        parts = []
        while chunk := stream.read(min(_CHUNK, self.left + 1)):
            self.left -= len(chunk)
            if self.left < 0:
                raise _TooLarge(f" (at member {name!r})")
            parts.append(chunk)
        return b"".join(parts)


class _LimitedReader(io.RawIOBase):
    """A read-only stream that raises once more than ``limit`` bytes have been read."""

    def __init__(self, inner: io.BufferedIOBase, limit: int) -> None:
        self._inner = inner
        self._left = limit

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        want = self._left + 1 if size is None or size < 0 else min(size, self._left + 1)
        chunk = self._inner.read(want)
        self._left -= len(chunk)
        if self._left < 0:
            raise _TooLarge("")
        return chunk


def pack_model(path: Path) -> bytes | None:
    """A zip (stored, not compressed: weights do not compress) of the model at ``path`` and
    the data files it names, or None when the model is self-contained or already an
    archive."""
    import onnx
    from google.protobuf.message import DecodeError

    from tuner_service.compiler.frontend.external import FolderFiles, external_locations

    try:
        model = path.read_bytes()
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror or e}") from e
    if is_archive(model):
        return None  # already the form uploads take
    try:
        proto = onnx.load_model_from_string(model)
    except (DecodeError, ValueError) as e:
        raise ModelError(f"{path} is not an ONNX model: {e}") from e
    locations = [loc for loc in external_locations(proto) if loc != path.name]
    if not locations:
        return None
    files = FolderFiles(path.parent)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(path.name, model)
        for location in locations:
            archive.writestr(location, files.read(location))
    logger.info("packed %s with %d data files (%d bytes)", path.name, len(locations),
                buffer.tell())
    return buffer.getvalue()


def model_upload(path: Path) -> tuple[bytes, str]:
    """What to upload for the model at ``path``: its bytes and name, or, when its tensors live
    in files beside it, a zip of it and those files (``NAME.zip``)."""
    packed = pack_model(path)
    if packed is None:
        try:
            return path.read_bytes(), path.name
        except OSError as e:
            raise ModelError(f"cannot read {path}: {e.strerror or e}") from e
    return packed, f"{path.stem}.zip"
