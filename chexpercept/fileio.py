"""Every file and folder the toolkit writes: private from creation, replaced whole, appended durably.

The one module that creates files (builder/, metrics/, eval/ and the datasets builder go through it;
``tests/test_fileio.py`` checks that no other module writes a file or makes a folder itself). Its
rules, decided here once:

- **Private from creation.** A file is created with mode 0600 and a folder with 0700, whatever the
  process's umask (a umask can only remove bits). Results, run metadata, reports, bundles and review
  data hold MIMIC identifiers or pixels; on a shared server nobody else may read them, so nothing is
  created readable and tightened afterwards. A folder that already exists is left as it is, except
  the toolkit's own output folders (``private_dir(..., own=True)``), which are tightened when this
  account owns them and refused when another account does, whatever their mode (their owner can
  read them, and can open them up again at any time).
- **Replaced whole.** ``write_atomic`` writes a temporary file beside the target (same folder, so
  the rename is atomic), flushes it to disk, renames it over the target and flushes the folder: a
  reader sees the old complete file or the new complete file, never a part, and a crash leaves one of
  them. ``replaced_dir`` does the same for a folder of many outputs (a report, a bundle): it is built
  aside and swapped in with one rename (``renameat2(RENAME_EXCHANGE)`` where Linux has it).
- **Appended durably.** ``append_durable`` writes whole lines in one ``write`` on an ``O_APPEND``
  descriptor under an exclusive ``flock`` (several processes may append to one file), then ``fsync``.
  A crash leaves at most one torn last line, which readers skip and ``chexpercept.eval.runner.store``
  repairs.
- **Ours, where it is written.** Every file is opened ``O_NOFOLLOW`` and checked after opening
  (``fstat``): a regular file of this account in a folder of this account (or root's). A run folder
  swapped mid-run by another account (its own folder or a link to one put in its place) or a file of
  theirs put where ours was is refused before a byte is written (PrivacyError).

Every write here is fsynced: run.json and the report are small, and a power cut must not leave an
empty run.json beside a results file whose settings then could not be checked.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path as FsPath
from typing import IO, TYPE_CHECKING, Any

from .errors import Refused

if TYPE_CHECKING:
    from .input_files import Limit

#: modes of everything the toolkit creates (before the umask, which can only remove bits)
FILE_MODE = 0o600
DIR_MODE = 0o700
#: bits that let another account read or enter
OTHERS = stat.S_IRWXG | stat.S_IRWXO


class PrivacyError(Refused, PermissionError):
    """An output folder is readable by other accounts and this account cannot make it private."""


# ------------------------------------------------------------------------------------- folders
def private_dir(
    path: str | os.PathLike[str], *, own: bool = False, remedy: str = "choose a folder of your own"
) -> FsPath:
    """``path`` as a folder, made with its missing parents at mode 0700; returns it.

    Folders that already exist are left alone, unless ``own``: ``path`` is then one of the toolkit's
    own output folders (a run folder, a report, the datasets cache), which must belong to this account
    (PrivacyError naming the folder, its owner and ``remedy`` otherwise, whatever its mode); it is
    tightened to 0700 if others can read it. The folder above it may be another account's (a group's
    project folder): every write checks that its file and folder are this account's (``_open_ours``),
    so a folder swapped there mid-run gets nothing.
    """
    path = FsPath(path)
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it first
            os.mkdir(folder, DIR_MODE)
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(path))
    if own:
        tighten(path, remedy=remedy)
    return path


def _check_ours(fd: int, path: FsPath) -> None:
    """After opening ``path`` for writing (``O_NOFOLLOW``: never through a link): PrivacyError unless
    the file is a regular file of this account in a folder of this account (or root's). A run folder
    swapped mid-run by another account (its own folder, or a link to one, put in its place) or a file
    of theirs put where ours was is refused before a byte is written."""
    from .input_files import file_kind

    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise PrivacyError(
            f"{path} is not a regular file ({file_kind(info.st_mode)}); the toolkit writes only to its own "
            "regular files: remove it or choose another folder"
        )
    if info.st_uid != os.geteuid():
        raise PrivacyError(
            f"{path} is not a file of this account ({owner_name(os.geteuid())}): it belongs to "
            f"{owner_name(info.st_uid)}; nothing is written into it (its owner would read it). Was the "
            "folder replaced while the toolkit was writing? Use a folder only you can write to"
        )
    _check_holder(path.parent, path, "use a folder only you can write to")


def _open_ours(path: FsPath, flags: int) -> int:
    """``os.open`` of a file to write (``_check_ours``), created private when it does not exist; the
    folder is checked first too, so that nothing is created in a folder of another account. Opened
    ``O_NOFOLLOW | O_NONBLOCK``: a link is refused and a FIFO put in the file's place never blocks
    the open (it is then refused as not a regular file)."""
    _check_holder(path.parent, path, "use a folder only you can write to")
    try:
        fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, FILE_MODE)
    except OSError as e:
        if e.errno == errno.ENXIO:  # a FIFO opened write-only with nobody reading it
            raise PrivacyError(
                f"{path} is not a regular file (a FIFO); the toolkit writes only to its own regular "
                "files: remove it or choose another folder"
            ) from None
        if e.errno == errno.ELOOP:
            raise PrivacyError(
                f"{path} is a link: the toolkit writes only to its own files, never through a link"
            ) from None
        raise
    try:
        _check_ours(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_holder(holder: FsPath, path: FsPath, remedy: str) -> None:
    """PrivacyError when the folder that holds ``path`` belongs to another account (root apart: it
    can read everything anyway): its owner could rename ``path`` away, replace it, or read what the
    toolkit writes in folders it makes there."""
    info = os.stat(holder)
    if info.st_uid not in (os.geteuid(), 0):
        raise PrivacyError(
            f"{path} is inside {holder}, which belongs to {owner_name(info.st_uid)}, not to this account "
            f"({owner_name(os.geteuid())}); its owner could replace or read what the toolkit writes there "
            f"(identifiers and images): {remedy}"
        )


def no_open_way(folder: str | os.PathLike[str], *, remedy: str = "choose a folder of your own") -> None:
    """Every folder on the way to ``folder`` (itself and those above it, links resolved) closed to
    renames by other accounts, for files written there by a library that does not check each write
    as ours do (``_open_ours``): a folder others may write into without the sticky bit lets any of
    them move what is inside away and put a folder of their own in its place, mid-write, and a
    folder's owner may do so whatever its mode. One of this account's is closed (its g+w and o+w
    removed); another account's (root apart) raises PrivacyError naming it and ``remedy``, and so
    does one of root's that the group or everyone may write into without the sticky bit. A datasets
    cache made under umask 000 (0777) let another account swap the builder's folder while it wrote,
    and read the Arrow rows (red team, stop 43); round 2: a group-writable cache, or one below a
    folder of another account, let them do the same."""
    path = FsPath(os.path.realpath(folder))
    me = os.geteuid()
    for way in [path, *path.parents]:
        try:
            info = os.stat(way)
        except FileNotFoundError:
            continue
        mode = stat.S_IMODE(info.st_mode)
        # the sticky bit keeps others from moving what is not theirs (its owner apart)
        others_write = bool(mode & (stat.S_IWGRP | stat.S_IWOTH)) and not mode & stat.S_ISVTX
        if info.st_uid == me:
            if others_write:  # ours: closed to the group's and everyone's renames
                os.chmod(way, mode & ~(stat.S_IWGRP | stat.S_IWOTH))
            continue
        if info.st_uid != 0:  # its owner may rename anything in it, whatever its mode
            raise PrivacyError(
                f"{way} belongs to {owner_name(info.st_uid)}, who may move any folder in it and put one "
                f"of its own in its place, mid-write: {remedy}"
            )
        if others_write:  # root's, open to others' writes without the sticky bit
            raise PrivacyError(
                f"{way} belongs to {owner_name(info.st_uid)} and other accounts may write into it (mode "
                f"{mode:04o}, no sticky bit): any of them could put a folder of its own in place of the "
                f"one written below it: {remedy}"
            )


def tighten(path: str | os.PathLike[str], *, remedy: str = "choose a folder of your own") -> None:
    """Make one existing file or folder of ours owner-only (``own`` outputs made by an older version,
    or under a lax umask). PrivacyError, naming the path, its owner and ``remedy`` (what to set
    instead), when another account owns it, whatever its mode: its owner can read everything written
    there and change its mode at any time, so a folder that will hold credentialed data must be ours."""
    path = FsPath(path)
    info = os.stat(path)
    if info.st_uid != os.geteuid():
        mode = stat.S_IMODE(info.st_mode)
        raise PrivacyError(
            f"{path} belongs to {owner_name(info.st_uid)} (mode {mode:04o}), not to this account "
            f"({owner_name(os.geteuid())}); the toolkit writes identifiers and images only into folders "
            f"this account owns (their owner can read them whatever the mode): {remedy}"
        )
    if info.st_mode & OTHERS:
        os.chmod(path, stat.S_IMODE(info.st_mode) & ~OTHERS)


def owner_name(uid: int) -> str:
    """``name (uid N)`` of an account, or ``uid N`` where it has no name."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def readable_by_others(path: str | os.PathLike[str]) -> bool:
    """Whether any account other than the owner could read ``path`` by its mode bits and those of
    its folders (group or others readable, and every folder above it enterable)."""
    path = FsPath(path).resolve()
    try:
        if not os.stat(path).st_mode & (stat.S_IRGRP | stat.S_IROTH):
            return False
        for folder in path.parents:
            if not os.stat(folder).st_mode & (stat.S_IXGRP | stat.S_IXOTH):
                return False
    except OSError:
        return False
    return True


def _fsync_dir(folder: FsPath) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems cannot sync a folder; the rename itself is still atomic
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------- files
def _aside_of(name: str | bytes | None, target: FsPath) -> str | None:
    """What a path written aside of ``target`` stands for: ``target`` for ``.<name>.<random>.tmp``
    and ``.<name>.new-<random>`` beside it, ``target/<rest>`` for a path inside such a folder; None
    for any other path."""
    if name is None:
        return None
    p, parent = FsPath(os.path.abspath(os.fsdecode(name))), FsPath(os.path.abspath(target.parent))
    for i, part in enumerate(p.parts):
        if part.startswith(f".{target.name}.") and FsPath(*p.parts[:i]) == parent:
            return str(target.joinpath(*p.parts[i + 1 :]))
    return None


def _named_as_target(error: OSError, target: FsPath) -> OSError:
    """``error`` naming the file the user asked for, not the one written aside of it: a message
    built from it (chexpercept/os_errors.py) names ``target``, never ``.s.json.x1y2.tmp``."""
    for attr in ("filename", "filename2"):
        shown = _aside_of(getattr(error, attr), target)
        if shown is not None:
            setattr(error, attr, shown)
    return error


def _temporary(path: FsPath) -> tuple[int, FsPath]:
    """A new private file beside ``path`` (same folder): its descriptor and name."""
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise _named_as_target(e, path) from None
    os.fchmod(fd, FILE_MODE)  # mkstemp's mode is 0600 already; said here so that the rule is one line
    return fd, FsPath(name)


def remove_stale_temporaries(folder: str | os.PathLike[str], names: Iterable[str]) -> int:
    """Remove the files that writes of ``names`` (in ``folder``) left beside them
    (``.<name>.<random>.tmp``, ``_temporary``), when their writer is known to be gone: the caller
    holds the folder's lock, so no write of these names is under way. A write killed (kill -9, a
    power cut) between its temporary file and the rename left it for good (red team, stop 43).
    Returns how many were removed."""
    removed = 0
    wanted = {f".{name}." for name in names}
    with os.scandir(folder) as entries:
        for entry in entries:
            stem = entry.name[: entry.name.rfind(".", 0, len(entry.name) - 4) + 1]
            if entry.name.endswith(".tmp") and stem in wanted and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed += 1
    return removed


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], mode: str = "wb", **open_args: Any) -> Iterator[IO[Any]]:
    """Write ``path`` through a file object (``mode`` "w" or "wb"); it replaces ``path`` whole when
    the block ends without an error, and nothing changes when it raises. Missing parent folders are
    made private."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file writes a file whole: mode 'w' or 'wb', got {mode!r}")
    path = FsPath(path)
    private_dir(path.parent)
    fd, tmp = _temporary(path)
    try:
        _check_ours(fd, path)  # the folder is ours: nobody else can rename the file in or out
        with os.fdopen(fd, mode, **open_args) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            _named_as_target(e, path)
        raise
    _fsync_dir(path.parent)


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, encoding: str = "utf-8") -> FsPath:
    """Replace ``path`` whole with ``data`` (text is encoded with ``encoding``); private (0600), on
    disk when this returns. Returns ``path``.

    A ``path`` that is not a file of a file system (a device such as ``/dev/null`` or ``/dev/full``,
    a pipe such as ``/dev/stdout`` or ``>(wc -c)``, a FIFO) is written to, never replaced: a command's
    ``--output /dev/null`` run as root replaced the system's /dev/null with a file."""
    payload = data.encode(encoding) if isinstance(data, str) else data
    try:
        kind = os.stat(path).st_mode
    except OSError:  # missing (created), or refused: atomic_file names the cause
        kind = stat.S_IFREG
    if not (stat.S_ISREG(kind) or stat.S_ISDIR(kind)):
        if stat.S_ISSOCK(kind):
            raise OSError(errno.ENXIO, "a socket, which is not written as a file", os.fspath(path))
        # never created here (O_CREAT off): a name that became a file meanwhile is not made public
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOCTTY)
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) and opened.st_uid not in (os.geteuid(), 0):
            os.close(fd)  # what was opened, not what was checked before: another account's pipe
            raise PrivacyError(
                f"{path} is a pipe, device or socket of {owner_name(opened.st_uid)}, which would receive "
                "the output; write it elsewhere"
            )
        with open(fd, "wb") as f:
            f.write(payload)
        return FsPath(path)
    with atomic_file(path, "wb") as f:
        f.write(payload)
    return FsPath(path)


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, indent: int | None = 2) -> FsPath:
    """``data`` as JSON (UTF-8, non-ASCII kept), replacing ``path`` whole (``write_atomic``)."""
    text = json.dumps(data, indent=indent, ensure_ascii=False)
    try:
        payload = (text + "\n").encode("utf-8")
    except UnicodeEncodeError:  # a name that is not UTF-8 (a folder named in bytes): \udcff in JSON
        payload = (json.dumps(data, indent=indent) + "\n").encode("ascii")
    return write_atomic(path, payload)


def write_new(path: str | os.PathLike[str], data: bytes | str, *, encoding: str = "utf-8") -> FsPath:
    """Create ``path``, which must not exist, with ``data``: private, on disk when this returns. For
    the files of a folder that is built aside and then swapped in whole (``replaced_dir``, a case
    folder of a bundle), where the folder's rename is what makes them appear."""
    payload = data.encode(encoding) if isinstance(data, str) else data
    path = FsPath(path)
    private_dir(path.parent)
    fd = _open_ours(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def copy_file(
    source: str | os.PathLike[str], target: str | os.PathLike[str], *, limit: Limit, what: str = "file"
) -> FsPath:
    """A private copy of ``source`` at ``target``, replacing it whole (the bytes only, not the mode).
    ``source`` is read as every input is (chexpercept.input_files): a regular file within ``limit``,
    read through a bounded stream, so a FIFO or a device in its place is refused, never copied."""
    from .input_files import open_input

    with open_input(source, limit, what=what) as src, atomic_file(target, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    return FsPath(target)


def append_durable(path: str | os.PathLike[str], payload: bytes) -> None:
    """Append ``payload`` (whole lines) to ``path`` in one locked write, then flush it to disk;
    the file is created private. Processes appending to one file never interleave their lines."""
    if not payload:
        return
    path = FsPath(path)
    new = not path.exists()
    fd = _open_ours(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            view = memoryview(payload)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    if new:  # the file's name must survive a power cut too
        _fsync_dir(path.parent)


def open_private(path: str | os.PathLike[str], flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """A descriptor of ``path`` opened with ``flags``; created private when it does not exist (locks,
    files updated in place); never through a link, and only a file of this account in a folder of
    this account (``_check_ours``)."""
    return _open_ours(FsPath(path), flags)


@contextlib.contextmanager
def exclusive(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (a private lock file, made when missing) for the
    block: a short section that two processes must not run at once. The kernel frees it when the
    holder dies, however it dies."""
    fd = _open_ours(FsPath(path), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor frees its lock


def cut_tail(path: str | os.PathLike[str], *, limit: Limit, what: str = "file") -> bytes:
    """Cut a torn last line (bytes after the last newline) off ``path`` in place, under an exclusive
    ``flock``, and flush it to disk; returns the bytes removed (empty when the file ends with a
    newline or does not exist). ``path`` is opened as every file the toolkit writes
    (``_open_ours``: never through a link, a regular file of this account) and must be within
    ``limit`` (chexpercept.input_files), so a link to a file elsewhere is never cut."""
    from .input_files import check_input_stat

    path = FsPath(path)
    try:
        fd = _open_ours(path, os.O_RDWR)
    except FileNotFoundError:
        return b""
    try:
        check_input_stat(path, os.fstat(fd), limit, what=what)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            size = os.lseek(fd, 0, os.SEEK_END)
            if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
                return b""
            keep, pos, block = 0, size, 1 << 16
            while pos > 0:
                start = max(0, pos - block)
                nl = os.pread(fd, pos - start, start).rfind(b"\n")
                if nl >= 0:
                    keep = start + nl + 1
                    break
                pos = start
            torn = os.pread(fd, size - keep, keep)
            os.ftruncate(fd, keep)
            os.fsync(fd)
            return torn
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------- whole folders
_RENAME_EXCHANGE = 2


def _exchange(a: FsPath, b: FsPath) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    result = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def aside_dirs(path: str | os.PathLike[str]) -> list[FsPath]:
    """Folders that ``replaced_dir`` left beside ``path`` when a process was killed while building or
    swapping (``.<name>.new-*`` / ``.<name>.old-*``)."""
    path = FsPath(path)
    if not path.parent.is_dir():
        return []
    return sorted(
        p
        for p in path.parent.iterdir()
        if p.name.startswith((f".{path.name}.new-", f".{path.name}.old-")) and p.is_dir()
    )


class NotOursError(Refused, FileExistsError):
    """``replaced_dir`` was asked to replace a folder that the toolkit did not make: refused on
    purpose (``errors.Refused``), so every command says it in one line with status 2."""


def _refuse_unless_ours(path: FsPath, marker: str | None, not_done: str, would: str) -> None:
    """The rule of ``replaced_dir`` and ``claim_output_dir``: ``path`` is a folder (not a link, not a
    file), and when it holds anything it holds ``marker`` (None: every folder there is the caller's)."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise NotADirectoryError(errno.ENOTDIR, f"not a folder, {not_done}", str(path))
    if marker and path.is_dir() and any(path.iterdir()) and not (path / marker).is_file():
        raise NotOursError(
            f"{path} is not empty and was not written by this command (it has no {marker}); {would}, "
            "so nothing was written. Choose a new or empty folder"
        )


def claim_output_dir(path: str | os.PathLike[str], marker: str) -> FsPath:
    """``path`` made ready for a command that writes its files into it (not replaced whole, as
    ``replaced_dir`` does): new, empty, or written by that command before (it holds ``marker``),
    which is written there now. Anything else (a user's own folder, real PhysioNet files) raises
    NotOursError before anything is written."""
    path = FsPath(path)
    _refuse_unless_ours(path, marker, "not written", "its files would be written over")
    private_dir(path)
    if not (path / marker).exists():
        write_new(path / marker, "")
    return path


@contextlib.contextmanager
def replaced_dir(path: str | os.PathLike[str], *, marker: str | None) -> Iterator[FsPath]:
    """Build a folder aside and swap it in whole: yields a new private folder beside ``path``; when
    the block ends without an error it takes ``path``'s place in one rename and the old folder is
    removed; when it raises (or the process is killed) ``path`` is untouched. Leftovers of a killed
    process are removed on the next call.

    ``marker``: the name of a file that marks the folder as this kind of output (written into the new
    folder). An existing ``path`` is replaced only when it is empty or holds that file; anything else
    (a user's own folder passed by mistake) raises NotOursError before any work. None: the caller
    owns every folder at ``path`` by construction (a case folder inside a bundle being generated).
    """
    path = FsPath(path)
    _refuse_unless_ours(path, marker, "not replaced", "it would be replaced as a whole")
    private_dir(path.parent)
    for leftover in aside_dirs(path):
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        new = FsPath(tempfile.mkdtemp(prefix=f".{path.name}.new-", dir=path.parent))
    except OSError as e:
        raise _named_as_target(e, path) from None
    try:
        yield new
        if marker:
            write_new(new / marker, "")
    except BaseException as e:
        shutil.rmtree(new, ignore_errors=True)
        if isinstance(e, OSError):
            _named_as_target(e, path)  # a file written inside the new folder: named as in the target
        raise
    if path.exists():
        if _exchange(new, path):
            old = new  # after the exchange, ``new`` names the old folder
        else:
            old = FsPath(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.rmdir(old)
            os.rename(path, old)
            os.rename(new, path)
        _fsync_dir(path.parent)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(new, path)
        _fsync_dir(path.parent)


def replace_json_lines(path: str | os.PathLike[str], records: Mapping[str, Any] | list[Any]) -> None:
    """Rewrite a JSON-lines file whole from ``records`` (a list, or a mapping's values in order), each
    line one its reader takes (``input_files.json_line``: LineTooLong before anything is replaced)."""
    from .input_files import json_line

    values = list(records.values()) if isinstance(records, Mapping) else list(records)
    with atomic_file(path, "wb") as f:
        for n, value in enumerate(values, 1):
            f.write(
                json_line(json.dumps(value, ensure_ascii=False, separators=(",", ":")), what=f"record {n}")
            )
