"""What an operating-system error means, in words that name its real cause: the one place that turns an
``OSError`` into a message (``chexpercept run``, ``generate``, ``report``, ``score``, ``review``...).

``os.strerror`` alone often points at the wrong cause: "No space left on device" also means that the
file system has no free inodes left (``df -h`` then shows free space; ``df -i`` shows the cause),
"Permission denied" does not say who owns the folder, "Too many open files" does not say whether the
limit is this process's (``ulimit -n``) or the whole system's, "File name too long" does not say
which name. ``explain_os_error`` looks at the file system, the owner and the limits involved and
says what happened and what to do about it.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path as FsPath

from .escape import shell_word

#: what the advice ends with when the caller says nothing else
RERUN = "then rerun the command"
#: the option a command writes its output with, when the caller names none (chexpercept run's)
OUTPUT_DIR = "--output-dir"
#: stand-ins in the advice for the option of the command that was run (``explain_os_error``'s
#: ``option``), and for the options that choose an output's names (a run's adds --run-name)
_OPTION = "\x00option\x00"
_NAMES = "\x00names\x00"


@dataclass(frozen=True)
class OsErrorText:
    """An operating-system error as a user reads it: what happened, and what to do."""

    #: e.g. "no free inodes left on the file system of /runs/m/results.jsonl (No space left on device)"
    what: str
    #: e.g. "delete files there or use another file system (df -i /runs shows inodes), then rerun ..."
    advice: str

    def line(self, prog: str, process: str = "") -> str:
        """``<prog>: error: <what>. <Advice>.``; ``process``: which process of a launch says it
        (``process 1: ``, chexpercept.entry_point.launched_as)."""
        advice = self.advice.rstrip(".")
        return f"{prog}: {process}error: {self.what.rstrip('.')}. {advice[:1].upper()}{advice[1:]}."


def explain_os_error(
    error: OSError,
    folder: str | os.PathLike[str] | None = None,
    *,
    then: str = RERUN,
    option: str = OUTPUT_DIR,
) -> OsErrorText:
    """What ``error`` means and what to do about it.

    ``folder``: the folder the command was working in (its output folder), named when the error
    names no file; ``then``: how the advice ends (e.g. "then rerun the same command to resume");
    ``option``: the option of the command that was run that chooses where it writes (``--output``
    for score, ``--output-dir`` for run): the advice names that one, never another command's.
    The file system is looked at (``statvfs``, ``stat``, the open-file limits) to tell causes that
    share an errno apart; an error without an errno (PIL's, a library's) is described as it is.
    """
    where = _where(error, folder)
    reason = os.strerror(error.errno) if error.errno else str(error)
    explain = _EXPLAIN.get(error.errno or -1)
    if explain is None:
        return OsErrorText(f"{type(error).__name__} on {where}: {reason}", f"fix the cause, {then}")
    text = explain(error, where, reason, str(folder or where), then)
    names = f"--run-name, {option}" if option == OUTPUT_DIR else option

    def fill(s: str) -> str:
        return s.replace(_NAMES, names).replace(_OPTION, option)

    return OsErrorText(fill(text.what), fill(text.advice))


def _where(error: OSError, folder: str | os.PathLike[str] | None) -> str:
    name = error.filename if error.filename not in (None, "") else folder
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    return str(name) if name is not None else "(no file named)"


def _existing(path: str) -> FsPath | None:
    """``path`` or its nearest existing ancestor (None when none can be looked at)."""
    p = FsPath(os.path.abspath(path))
    for candidate in (p, *p.parents):
        try:
            candidate.lstat()
            return candidate
        except OSError:
            continue
    return None


#: at most this many free inodes, or free bytes, counts as none left: the command may have removed a
#: temporary file or a lock since the write failed (a file system is judged after the error)
_FEW_INODES = 16
_FEW_BYTES = 1 << 20


def _no_space(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    at = _existing(where) or _existing(folder)
    try:
        fs = os.statvfs(at) if at is not None else None
    except OSError:
        fs = None
    if fs is None:
        inodes_short = space_short = True
    else:
        inodes_short = fs.f_files > 0 and fs.f_favail <= max(_FEW_INODES, fs.f_files // 1000)
        space_short = fs.f_bavail * fs.f_frsize <= max(_FEW_BYTES, fs.f_blocks * fs.f_frsize // 1000)
    if inodes_short and not space_short:
        return OsErrorText(
            f"no free inodes left on the file system of {where}: it can hold no more files, although "
            f"it has space left ({reason}; df -i {shell_word(folder)} shows IUse% 100%)",
            f"delete files there (many small files use up inodes) or write to another file system, {then}",
        )
    if space_short and not inodes_short:
        return OsErrorText(
            f"no space left on the device of {where} ({reason})",
            f"free space there (df -h {shell_word(folder)}), {then}",
        )
    now = (
        ""
        if fs is None
        else f"; it now has {_size(fs.f_bavail * fs.f_frsize)} and {fs.f_favail:,} inodes free"
    )
    return OsErrorText(
        f"no space or no free inodes left on the device of {where} ({reason}{now})",
        f"free space or files there (df -h {shell_word(folder)} shows space, df -i {shell_word(folder)} inodes), {then}",
    )


def _size(n: int) -> str:
    """``512 bytes``, ``3.9 MiB``."""
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{n:,} bytes" if unit == "bytes" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} TiB"


def _quota(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"your disk quota is used up on the file system of {where} ({reason}): the disk may have space "
        "left, but this account may not use more of it",
        f"free space within your quota (quota -s shows it) or ask for a larger one, {then}",
    )


def _read_only(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"cannot write to {where}: its file system is mounted read-only ({reason})",
        f"write to a writable place instead (another {_OPTION}), {then}",
    )


def _owner(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid} (no such user here)"


def _denied(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    at = _existing(where)
    try:
        st = at.stat() if at is not None else None
    except OSError:
        st = None
    if at is None or st is None:
        return OsErrorText(f"no permission to use {where} ({reason})", f"use a folder of your own, {then}")
    shown = f"{at} (mode {stat.filemode(st.st_mode)}, owner {_owner(st.st_uid)})"
    if st.st_uid != os.geteuid():
        return OsErrorText(
            f"no permission to use {where} ({reason}): {shown} belongs to another user, not to you "
            f"({_owner(os.geteuid())})",
            f"use a folder of your own (e.g. another {_OPTION}), or ask {_owner(st.st_uid)} to give "
            f"you access, {then}",
        )
    return OsErrorText(
        f"no permission to use {where} ({reason}): the permissions of {shown} do not allow it",
        f"change them (chmod u+rwx {shell_word(at)}) or use another folder, {then}",
    )


def _too_many_open(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft:,}"
    return OsErrorText(
        f"this process has too many files open at once, opening {where} ({reason}; its limit is "
        f"{limit}, ulimit -n)",
        "raise the limit in the shell that runs the command (ulimit -n 65536) or lower --concurrency "
        f"/ --batch-size, {then}",
    )


def _system_files(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"the whole system has too many files open (its table is full), opening {where} ({reason}); "
        "this process's own limit is not the cause",
        f"close other programs, or ask the administrator to raise fs.file-max, {then}",
    )


def _name_too_long(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    parts = [p for p in where.split(os.sep) if p]
    longest = max(parts, key=lambda p: len(os.fsencode(p)), default=where)
    size = len(os.fsencode(longest))
    at = _existing(where)
    try:
        name_max = os.pathconf(at, "PC_NAME_MAX") if at is not None else 255
    except (OSError, ValueError):
        name_max = 255
    if size > name_max:
        shown = longest if len(longest) <= 60 else longest[:57] + "..."
        what = f"a file or folder name is too long: {shown!r} has {size} bytes, more than the {name_max} "
        what += f"this file system allows ({reason})"
    else:
        tail = where if len(where) <= 80 else "..." + where[-77:]  # its end names the file
        what = f"the path {tail} is too long ({len(os.fsencode(where))} bytes; {reason})"
    return OsErrorText(what, f"use a shorter name ({_NAMES}), {then}")


def _not_a_folder(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    p = FsPath(os.path.abspath(where))
    for candidate in reversed((p, *p.parents)):
        if candidate.exists() and not candidate.is_dir():
            return OsErrorText(
                f"{candidate} is a file, not a folder, so {where} cannot be made or opened ({reason})",
                f"choose a path whose folders are folders (e.g. another {_OPTION}), {then}",
            )
    return OsErrorText(f"a part of {where} is not a folder ({reason})", f"choose another path, {then}")


def _is_a_folder(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"{where} is a folder where a file was expected ({reason})", f"give the file's path, {then}"
    )


def _missing(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    from .errors import no_such_path

    return OsErrorText(f"{no_such_path(where, 'file or folder')} ({reason})", f"check the path, {then}")


def _io(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"the device failed to read or write {where} ({reason}): a disk or network file system error, "
        "not a problem of the data",
        f"check the device (dmesg; for a network file system, its server), {then}",
    )


def _stale(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"the network file system lost track of {where} ({reason}): it was replaced or removed on "
        "another machine while this one had it open",
        f"check that no other machine writes to the same folder, {then}",
    )


def _loop(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"the symbolic links on the way to {where} form a loop or a chain too long to follow ({reason})",
        f"fix the links (ls -l along the path), {then}",
    )


def _too_large(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY:
        return OsErrorText(
            f"{where} is too large: it reached the largest file this process may write: {_size(soft)} (ulimit -f, set in "
            f"the shell or by the job scheduler; {reason})",
            f"raise it (ulimit -f unlimited, or the scheduler's file-size limit) in the shell that runs "
            f"the command, {then}",
        )
    return OsErrorText(
        f"{where} is too large for its file system, the largest one file may be ({reason}; FAT/exFAT: 4 GiB; "
        "df -T shows the type)",
        f"write to another file system (another {_OPTION}), {then}",
    )


def _no_locks(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"the file system of {where} cannot lock files ({reason}): a network file system (NFS) "
        "mounted without its lock service (rpc.statd, lockd), or a file system that has no locks; a "
        "run locks its folder so that two runs never write it at once",
        f"put the output on a local disk (another {_OPTION}), or ask the administrator to "
        f"start the lock service or mount it with local_lock=all, {then}",
    )


def _cross_device(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"{where} could not be moved into place: the file written beside it is on another file system "
        f"(a mount point or bind mount inside the output folder; {reason})",
        f"use an output folder with no mount point inside it, {then}",
    )


def _busy(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"{where} is in use and cannot be replaced or removed ({reason}): a mount point, or a file "
        "a running program holds",
        f"find what holds it (fuser -v {where}; findmnt), stop it, {then}",
    )


def _not_empty(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"{where} could not be replaced: a folder there is not empty ({reason}); another command may "
        "be writing the same output at the same time",
        f"wait for it to finish (or write to another folder), {then}",
    )


def _exists(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"{where} already exists where a new file or folder was to be made ({reason}); another command "
        "may be writing the same output at the same time",
        f"wait for it to finish (or write to another folder), {then}",
    )


def _invalid(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"the file system of {where} refused the operation ({reason}): a name it cannot hold (':' '?' "
        "'*' on FAT or SMB shares) or a flush to disk or lock it does not support (some FUSE mounts)",
        f"put the output on a local disk (another {_OPTION}), {then}",
    )


def _unsupported(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"the file system of {where} does not support an operation every write needs (a lock, a "
        f"flush to disk or an atomic rename; {reason}): some FUSE and network file systems lack them",
        f"put the output on a local disk (another {_OPTION}), {then}",
    )


def _too_many_links(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"the folder of {where} holds as many entries as its file system allows ({reason})",
        f"use another folder, or fewer files in one, {then}",
    )


def _network_fs(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"the network or FUSE file system of {where} stopped answering ({reason}): its server is "
        "unreachable, or the program that serves the mount (sshfs, s3fs, ...) has ended",
        f"check the mount (findmnt; ls {folder}) and its server, or use a local disk, {then}",
    )


def _corrupt(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"the file system of {where} is damaged ({reason}): the kernel stopped using part of it",
        f"ask the administrator to check it (dmesg; fsck / xfs_repair), and write elsewhere, {then}",
    )


def _kernel_memory(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"the system ran out of memory while handling {where} ({reason}), not a problem of the file",
        f"free memory (fewer processes, a smaller --batch-size), {then}",
    )


def _interrupted(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"writing {where} was interrupted by a signal before it finished ({reason})",
        f"nothing is lost that the rerun does not redo, {then}",
    )


def _ticket(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"your access to {where} expired ({reason}): the Kerberos ticket a network file system asks for",
        f"renew it (kinit; klist shows it), {then}",
    )


def _busy_text(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    return OsErrorText(
        f"{where} is a program that is running now and cannot be written ({reason})",
        f"write to another path, {then}",
    )


def _reader_gone(error: OSError, where: str, reason: str, folder: str, then: str) -> OsErrorText:
    """EPIPE on a file or connection a command wrote to: the program or server at its other end
    closed it. (Standard output's own reader going away, ``| head``, is ``chexpercept.stdio.OutputLoss``.)"""
    named = where if error.filename not in (None, "") else "a pipe or connection this command was writing to"
    return OsErrorText(
        f"the program reading {named} closed its end ({reason}) before everything was written",
        f"check that the program or server at the other end is still running, {then}",
    )


_EXPLAIN = {
    errno.EPIPE: _reader_gone,
    errno.ENOSPC: _no_space,
    errno.EROFS: _read_only,
    errno.EACCES: _denied,
    errno.EPERM: _denied,
    errno.EMFILE: _too_many_open,
    errno.ENFILE: _system_files,
    errno.ENAMETOOLONG: _name_too_long,
    errno.ENOTDIR: _not_a_folder,
    errno.EISDIR: _is_a_folder,
    errno.ENOENT: _missing,
    errno.EIO: _io,
    errno.ELOOP: _loop,
    # what a write, a lock, an fsync or a rename can also raise (issue 28, class E: each by its cause)
    errno.EFBIG: _too_large,
    errno.ENOLCK: _no_locks,
    errno.EXDEV: _cross_device,
    errno.EBUSY: _busy,
    errno.ENOTEMPTY: _not_empty,
    errno.EEXIST: _exists,
    errno.EOPNOTSUPP: _unsupported,
    errno.ENOTSUP: _unsupported,
    errno.EINVAL: _invalid,
    errno.EMLINK: _too_many_links,
    errno.ETIMEDOUT: _network_fs,
    errno.ENOTCONN: _network_fs,
    errno.EHOSTDOWN: _network_fs,
    errno.EHOSTUNREACH: _network_fs,
    errno.ENOMEM: _kernel_memory,
    errno.EINTR: _interrupted,
    errno.ETXTBSY: _busy_text,
}
for _name, _explain in (("EREMOTEIO", _network_fs), ("EUCLEAN", _corrupt), ("EKEYEXPIRED", _ticket)):
    if hasattr(errno, _name):
        _EXPLAIN[getattr(errno, _name)] = _explain
if hasattr(errno, "EDQUOT"):
    _EXPLAIN[errno.EDQUOT] = _quota
if hasattr(errno, "ESTALE"):
    _EXPLAIN[errno.ESTALE] = _stale
