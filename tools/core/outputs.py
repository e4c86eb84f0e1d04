"""Output folders: trainwright never deletes or overwrites a file it did not write.

Every folder trainwright writes into (a plan's ``--out``, a ``report`` folder and its brief
folders, a smoke run's ``--run-dir``, a ``/save`` destination) keeps a manifest,
``.trainwright-manifest.json``: the relative name, size and SHA-256 of every file trainwright
wrote there. All writes and removals in such a folder go through this module:

- ``write_file`` / ``copy_file`` replace a file only when the manifest lists it and its bytes
  are unchanged since (or when they already hold exactly the new bytes, so nothing is lost); a
  file of the user's, or one the user edited after a run, is refused with one line naming it
  (``OutputRefused``, exit 2). Symlinks and non-regular files in the folder are never written.
- ``remove_file`` removes only a file the manifest lists whose bytes are unchanged; a file the
  user edited since stays and drops out of the manifest (it is the user's now).
- ``claim`` runs before any work: it refuses a non-empty folder without a manifest (one line,
  exit 2) unless ``force``, and refuses, naming it, a foreign file among the names the caller
  will certainly write. ``force`` only allows sharing the folder: foreign files are still
  never touched.

- ``reserve`` marks files our child processes (a smoke run's ranks) are about to write. A
  reserved entry owns only what was written while the run was alive: the run refreshes it
  (``keep_reserved``) every ``KEEP_RESERVED_S``, and after a kill a file counts as the run's
  only when its ctime (which no file operation can set back) is at most
  ``RESERVED_GRACE_S`` after the last refresh. A file the user wrote or edited later is
  refused like any other foreign file.

The manifest is read, updated and rewritten (atomically, ``tools.core.files``) under an
``flock``, together with the file write it
records, so concurrent writers (threads or processes) do not lose each other's entries.
The lock is taken on the folder itself (an ``flock`` on its descriptor). The manifest also
records, by exact name, the temporary files of writes in flight (and its own): the next write
under the lock removes those a killed writer left. Nothing is ever removed by its name's
pattern. A symbolic link inside an output folder is never followed to write, be it a file, a
subfolder (a ``report`` brief's) or a folder on the way. ``hold`` serializes whole runs into
one folder (``report``) with an ``flock`` on ``.trainwright-lock``.

The manifest itself (stored, locked, its entries checked) is tools/core/manifest.py's;
``confined`` (a remote caller's folder name, kept inside a root) is tools/core/paths.py's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tools.core.errors import InputError, shown
from tools.core.files import temp_path, write_atomic_bytes
from tools.core.manifest import (
    LOCK,
    MANIFEST,
    file_entry,
    foreign_entries,
    locked,
    matches_entry,
    read_manifest,
    write_manifest,
)


class OutputRefused(InputError):
    """Writing would touch a file trainwright did not write, or a folder it does not own.

    An ``InputError`` (one line, exit 2) that the agents' tool loop does not hand back to the
    model: no tool call can talk its way past it.
    """


def owned(folder: Path) -> bool:
    """Whether ``folder`` has a trainwright manifest."""
    return (Path(folder) / MANIFEST).is_file()


def _check_name(name: str) -> None:
    parts = Path(name).parts
    if not parts or Path(name).is_absolute() or ".." in parts or "\x00" in name:
        raise ValueError(f"not a relative file name: {name!r}")


def _refuse(path: Path, field: str, why: str) -> OutputRefused:
    return OutputRefused(
        field,
        f"{shown(str(path), 160)} {why}; trainwright never overwrites it (move it away or "
        "choose another folder)",
    )


def _check_one(
    folder: Path,
    name: str,
    manifest: dict[str, dict[str, Any]] | None,
    data: bytes | None,
    field: str,
) -> None:
    """Refuse when ``folder/name`` exists and is not ours to replace."""
    path = folder / name
    # Every folder on the way must be a real folder inside ``folder``, not a link out of it.
    for parent in list(Path(name).parents)[:-1][::-1]:
        sub = folder / parent
        if sub.is_symlink() or (sub.exists() and not sub.is_dir()):
            raise _refuse(sub, field, "is not a folder trainwright made")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, field, "exists and is not a regular file")
    entry = (manifest or {}).get(name)
    if matches_entry(path, entry, data):
        return
    if entry is not None:
        raise _refuse(path, field, "was changed after trainwright wrote it")
    raise _refuse(path, field, "was not written by trainwright")


def _check_folder(folder: Path, field: str) -> None:
    if folder.exists() and not folder.is_dir():
        raise InputError(field, f"{shown(str(folder), 160)} exists and is not a directory")
    check_no_link(folder, field)


def check_no_link(folder: Path, field: str) -> None:
    """Refuse ``folder`` when it is reached through a symbolic link inside an output folder.

    ``rep/a`` linked to a folder elsewhere, with ``rep`` a ``report`` folder of ours, would
    send a brief's files there. The user's own ``--out`` may be a link; a link inside one of
    our folders (which a rerun's writes would follow) never is.
    """
    path = Path(os.path.abspath(folder))
    for p in (path, *path.parents):
        if p.is_symlink() and os.path.lexists(p.parent / MANIFEST):
            raise OutputRefused(
                field,
                f"{shown(str(p), 160)} is a symbolic link inside an output folder of "
                "trainwright's; trainwright never writes through one (remove the link or "
                "choose another folder)",
            )


def subfolder(folder: Path, name: str, field: str = "--out", *, create: bool = True) -> Path:
    """``folder/name`` as a real folder inside ``folder`` (made when ``create``); never a link.

    For the folders a run makes under an output folder (a ``report`` brief's folder, a smoke
    run's ``tmp`` and ``metrics``): a symbolic link or a file there is refused, one line.
    """
    _check_name(name)
    folder = Path(folder)
    _check_folder(folder, field)
    for part in [*list(Path(name).parents)[:-1][::-1], Path(name)]:
        sub = folder / part
        if sub.is_symlink() or (sub.exists() and not sub.is_dir()):
            what = "a symbolic link" if sub.is_symlink() else "not a folder"
            raise OutputRefused(
                field,
                f"{shown(str(sub), 160)} is {what}; trainwright writes only into folders it "
                "made, never through a link (remove it or choose another folder)",
            )
    if create:
        (folder / name).mkdir(parents=True, exist_ok=True)
    return folder / name


def claim(
    folder: Path,
    *,
    force: bool = False,
    field: str = "--out",
    names: Iterable[str] = (),
    create: bool = False,
    force_flag: str | None = "--force",
) -> Path:
    """Make ``folder`` an output folder of ours, before any work; refuse what is not ours.

    A new or empty folder is fine (the first write makes it and its manifest). A non-empty
    folder without a manifest is refused (one line, exit 2) unless ``force``; with ``force``
    it gets an empty manifest (it is shared from now on), and its files stay untouched. Any of
    ``names`` (files the caller will certainly write) that exists and is not ours is refused
    now, naming it, rather than after minutes of work. ``create`` makes the folder (with its
    manifest) now; ``force_flag`` is the flag the refusal suggests (None: none exists).
    """
    folder = Path(folder)
    if str(folder).strip() == "":
        raise InputError(field, "give a folder name, not an empty string")
    if "\x00" in str(folder):
        raise InputError(field, "the path contains a NUL character")
    _check_folder(folder, field)
    if not folder.exists() and not create:
        return folder  # made by the first write: a run that fails before it leaves nothing
    with locked(folder):
        manifest = read_manifest(folder)
        foreign = foreign_entries(folder) if manifest is None else []
        if manifest is None:
            if foreign and not force:
                raise OutputRefused(
                    field,
                    f"{shown(str(folder), 160)} is not empty and was not written by trainwright "
                    "(or by a version before output manifests) "
                    f"(it holds {shown(foreign[0], 60)}"
                    + (f" and {len(foreign) - 1} more" if len(foreign) > 1 else "")
                    + "); choose another folder"
                    + (
                        f", or pass {force_flag} to write beside those files (they are never "
                        "touched)"
                        if force_flag
                        else ""
                    ),
                )
        for name in names:
            _check_name(name)
            _check_one(folder, name, manifest, None, field)
        if manifest is None and (foreign or create):
            write_manifest(folder, {})  # with force: the folder is shared from now on
    return folder


def check_files(
    folder: Path, names: Iterable[str] | Mapping[str, str | bytes | Path], *, field: str = "out_dir"
) -> None:
    """Refuse, naming it, the first of ``names`` in ``folder`` that is not ours to replace.

    ``names`` may map each name to the content it will get (text, bytes, or a file to copy):
    a foreign file that already holds exactly that content is not refused (nothing is lost).
    """
    folder = Path(folder)
    _check_folder(folder, field)
    manifest = read_manifest(folder)
    _ensure_owned(folder, manifest, field)
    for name in names:
        _check_name(name)
        content = names[name] if isinstance(names, Mapping) else None
        if isinstance(content, Path):
            content = content.read_bytes()
        data = content.encode("utf-8") if isinstance(content, str) else content
        _check_one(folder, name, manifest, data, field)


def _ensure_owned(folder: Path, manifest: dict[str, dict[str, Any]] | None, field: str) -> None:
    if manifest is None and foreign_entries(folder):
        raise OutputRefused(
            field,
            f"{shown(str(folder), 160)} is not empty and was not written by trainwright; "
            "choose another folder",
        )


def write_file(
    folder: Path,
    name: str,
    content: str | bytes,
    *,
    executable: bool = False,
    field: str = "out_dir",
) -> Path:
    """Write ``folder/name`` atomically if it is new or ours and unchanged; record it."""
    folder = Path(folder)
    _check_name(name)
    _check_folder(folder, field)
    data = content.encode("utf-8") if isinstance(content, str) else content
    with locked(folder):
        manifest = read_manifest(folder)
        _ensure_owned(folder, manifest, field)
        _check_one(folder, name, manifest, data, field)
        path = folder / name
        files = dict(manifest or {})
        entry = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        old = files.get(name)
        if old is not None and path.exists():
            # The new entry first, remembering the old bytes: a kill between the two writes
            # leaves a manifest that vouches for whichever the file holds.
            old = {k: v for k, v in old.items() if k != "prev"}
            files[name] = {**entry, "prev": old}
        else:
            files[name] = entry  # new, or already holding exactly these bytes
        # The temporary file's exact name goes into the manifest before it exists, so the
        # next write removes it if this one is killed before the rename.
        tmp = temp_path(path)
        write_manifest(folder, files, [str(tmp.relative_to(folder))])
        write_atomic_bytes(path, data, executable=executable, tmp=tmp)
        files[name] = entry
        write_manifest(folder, files)
    return path


def copy_file(folder: Path, name: str, source: Path, *, field: str = "out_dir") -> Path:
    """``write_file`` with ``source``'s bytes; an executable source gives an executable copy."""
    source = Path(source)
    executable = bool(os.stat(source).st_mode & 0o111)
    return write_file(folder, name, source.read_bytes(), executable=executable, field=field)


def remove_file(folder: Path, name: str) -> bool:
    """Remove ``folder/name`` if the manifest lists it and it is unchanged; True if removed.

    A listed file the user changed since stays (and leaves the manifest: it is theirs now); an
    unlisted one is not ours and stays.
    """
    folder = Path(folder)
    _check_name(name)
    if not folder.is_dir():
        return False
    check_no_link(folder, "out_dir")
    with locked(folder):
        manifest = read_manifest(folder)
        if not manifest or name not in manifest:
            return False
        path = folder / name
        removed = False
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if (
            st is not None
            and stat.S_ISREG(st.st_mode)
            and matches_entry(path, manifest[name], None)
        ):
            path.unlink()
            removed = True
        files = {k: v for k, v in manifest.items() if k != name}
        write_manifest(folder, files)
    return removed


def listed(folder: Path) -> list[str]:
    """The names the manifest of ``folder`` lists (none when it has no manifest)."""
    return sorted(read_manifest(Path(folder)) or {})


def reserve(folder: Path, names: Iterable[str]) -> None:
    """Mark files our child processes are about to write in ``folder`` as theirs.

    For a run that is killed before ``record``: what its ranks wrote while it was alive stays
    ours, so a rerun in the same folder may replace it; a file written or edited after the run
    is not (``_written_while_reserved``). The run calls ``keep_reserved`` while it lives. Names
    that exist already keep their entries (the caller checked with ``check_files`` that they
    are ours).
    """
    folder = Path(folder)
    _check_folder(folder, "--run-dir")
    with locked(folder):
        files = dict(read_manifest(folder) or {})
        now = time.time()
        for name in names:
            _check_name(name)
            if name not in files and not os.path.lexists(folder / name):
                files[name] = {"reserved": True, "sha256": None, "alive": now}
        write_manifest(folder, files)


def keep_reserved(folder: Path, names: Iterable[str]) -> None:
    """The run that reserved ``names`` is alive: refresh their reservations (see ``reserve``)."""
    folder = Path(folder)
    if not owned(folder):
        return  # gone, or not ours: nothing to refresh, and nothing is made
    with locked(folder):
        files = dict(read_manifest(folder) or {})
        now = time.time()
        changed = False
        for name in names:
            entry = files.get(name)
            if entry is not None and entry.get("reserved"):
                files[name] = {**entry, "alive": now}
                changed = True
        if changed:
            write_manifest(folder, files)


def record(folder: Path, names: Iterable[str]) -> None:
    """Add files our own child processes wrote in ``folder`` (smoke logs, metrics) to the manifest.

    The caller checked beforehand (``check_files``) that none of them was someone else's.
    """
    folder = Path(folder)
    _check_folder(folder, "--run-dir")
    with locked(folder):
        files = dict(read_manifest(folder) or {})
        for name in names:
            _check_name(name)
            path = folder / name
            if path.is_file() and not path.is_symlink():
                files[name] = file_entry(path)
            elif files.get(name, {}).get("reserved"):
                del files[name]  # reserved, never written
        write_manifest(folder, files)


@contextlib.contextmanager
def hold(
    folder: Path, on_wait: Callable[[], None] | None = None, *, field: str = "--out"
) -> Iterator[None]:
    """One run at a time writes into ``folder``: an exclusive ``flock`` on its ``LOCK`` file.

    A second run blocks until the first ends (the kernel releases the lock however the first
    ends), after calling ``on_wait`` once, so it can say that it waits. The lock file is empty
    and stays; it is opened without following a link and never written. Ctrl-C and SIGTERM
    interrupt the wait.
    """
    folder = Path(folder)
    _check_folder(folder, field)
    folder.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(folder / LOCK, flags, 0o666)
    except OSError as exc:
        raise OutputRefused(
            field, f"cannot open {shown(str(folder / LOCK), 160)}: {exc.strerror}"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
