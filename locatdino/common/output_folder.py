"""The one overwrite rule of every command that writes an output folder.

A file is a run's earlier output only by what that run wrote into its folder, never by the
file's name or shape (a plain ``results.json`` of the user's looks like ours): each run records
the files it writes, as it writes them, in ``OUT/.locatdino-output.json`` (the command, and per
file its path relative to ``OUT``, its size and its modification time). A later run of a command
into ``OUT``

- is refused before any work when ``OUT`` holds files an earlier run recorded, unless
  ``--overwrite``: one line, the same for every command (:meth:`OutputFolder.check`);
- with ``--overwrite``, removes every recorded file when it starts, so nothing of the earlier run
  stays behind to be read as part of the new one (a one-model ``results.json`` beside a
  two-model run's folders);
- is refused, ``--overwrite`` or not, when a file it would write exists but no run recorded it,
  or when ``OUT`` holds another command's output.

The record is read as data that may be damaged or edited, never as a list of paths to delete: a
recorded file is removed only when its name is a plain relative path inside ``OUT`` (no ``..``, not
absolute, not the lock or the record itself), reached from ``OUT`` without following a symbolic link
(each folder opened with ``O_NOFOLLOW``, the file unlinked through that folder), and it is still the
regular file the run left: same size, same modification time. A record naming anything else is
damaged, and a recorded file changed since (or replaced by a folder or a link) is the user's: either
refuses the run in one line, before any work, and nothing is removed. A record that is not a regular
file (a folder, a link) is refused too. A record of an older locatdino lists names only: its files
count as the run's while no newer than the record itself (a run saved its record after each file it
wrote), so a file put there later is refused, not removed.

A command adopts the rule with :func:`add_overwrite_option` on its parser and::

    folder = OutputFolder(args.out, "knn")
    folder.check(["results.json", "report.md"], args.overwrite)  # before the work
    with folder.writing(args.overwrite):  # the folder's lock held, the earlier output removed
        folder.write_text("results.json", text)  # atomic, and recorded

A command whose output is one text file marks it instead (:func:`check_output_file`,
:func:`write_output_file`): a record beside it would be a file in a folder it does not own.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from locatdino.common.errors import UserError
from locatdino.common.output_files import (
    LOCK_NAME,
    atomic_write_text,
    ensure_writable,
    output_lock,
    remove_stale_temporaries,
)

RECORD_NAME = ".locatdino-output.json"
# names an output folder holds for its own bookkeeping: no label, run or file may take them
BOOKKEEPING_NAMES = (LOCK_NAME, RECORD_NAME)
_BOOKKEEPING = {name.casefold() for name in BOOKKEEPING_NAMES}  # one file on a case-insensitive disk
_T = TypeVar("_T")
Stamp = tuple[int, int] | None  # a recorded file's (size, mtime_ns); None in an older record (names only)
OVERWRITE_HELP = (
    "replace the output of an earlier run of this command (the files it recorded writing, removed "
    "when this run starts); a file this command did not write is never replaced"
)


def add_overwrite_option(group: Any) -> None:
    """``--overwrite``, with the one help text of every command (``group``: its output group)."""
    group.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def _relative(name: str | os.PathLike) -> str:
    return PurePosixPath(Path(name)).as_posix()


def _not_recordable(name: object) -> str | None:
    """Why ``name`` cannot be a file a run recorded in its folder (None: it can)."""
    if not isinstance(name, str) or not name or "\0" in name:
        return "not a file name"
    path = PurePosixPath(name)
    if path.is_absolute():
        return "an absolute path"
    if ".." in path.parts:
        return "a path through '..'"
    if path.as_posix() != name:
        return "not a plain relative path"
    if any(part.casefold() in _BOOKKEEPING for part in path.parts):
        return "the folder's own bookkeeping file"
    return None


def _stamp(info: os.stat_result) -> tuple[int, int]:
    return info.st_size, info.st_mtime_ns


class OutputFolder:
    """The output folder ``path`` of one run of ``command`` (``hbird``, ``linprobe``, ...), named
    ``option`` on the command line."""

    def __init__(self, path: str | os.PathLike, command: str, option: str = "--out") -> None:
        self.path, self.command, self.option = Path(path), command, option
        self._written: dict[str, tuple[int, int]] = {}

    def _refuse(self, problem: str) -> UserError:
        return UserError(f"{self.option} {self.path} {problem}")

    def earlier_output(self, earlier: list[str]) -> UserError:
        """The one refusal of a folder holding ``earlier`` output (relative paths) without ``--overwrite``;
        the file it names is one at the top of the folder when there is one (a run's results, not a sub-folder's)."""
        more = f" and {len(earlier) - 1} more" if len(earlier) > 1 else ""
        named = min(earlier, key=lambda name: name.count("/"))
        return self._refuse(
            f"holds the output of an earlier run ({named}{more}): pass --overwrite to replace "
            f"it, or choose another {self.option}"
        )

    def _damaged(self, name: object, why: str) -> UserError:
        return self._refuse(
            f"holds a damaged record {self.path / RECORD_NAME}: it lists {name!r}, {why} (a run removes only "
            f"files inside {self.option} reached without a link): nothing was removed, choose another {self.option}"
        )

    def recorded(self) -> tuple[str | None, dict[str, Stamp]]:
        """``(command, {file: (size, mtime_ns) or None})`` of the record in the folder (``(None, {})``
        when there is none); a record that is not a regular file, unreadable, or listing a name no
        run can have written (:func:`_not_recordable`) is refused in one line."""
        record = self.path / RECORD_NAME
        if not os.path.lexists(record):
            return None, {}
        if not stat.S_ISREG(os.lstat(record).st_mode):
            raise self._refuse(
                f"holds {record}, which is not a file (a folder or a link): choose another {self.option}"
            )
        try:
            data = json.loads(record.read_text())
            command, files = data["command"], data["files"]
            if isinstance(files, list):  # an older record: names only
                files = dict.fromkeys(files)
            elif not all(isinstance(v, dict) for v in files.values()):
                raise TypeError
            files = {k: None if v is None else (int(v["size"]), int(v["mtime_ns"])) for k, v in files.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise self._refuse(f"holds a damaged {RECORD_NAME}: choose another {self.option}") from None
        for name in files:
            why = _not_recordable(name)
            if why is not None:
                raise self._damaged(name, why)
        return command, files

    def _at(self, name: str, action: Callable[[int, str], _T]) -> _T | None:
        """``action(folder_fd, file_name)`` on the folder holding the recorded ``name``, reached from
        the output folder without following a symbolic link (None: a folder on the way is missing or
        is not a folder, so the file is not there); a link on the way makes the record damaged."""
        parts = PurePosixPath(name).parts
        fds = [os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)]
        try:
            for depth, part in enumerate(parts[:-1]):
                try:
                    mode = os.stat(part, dir_fd=fds[-1], follow_symlinks=False).st_mode
                except FileNotFoundError:
                    return None
                if stat.S_ISLNK(mode):
                    raise self._damaged(name, f"reached through the symbolic link {'/'.join(parts[: depth + 1])}")
                if not stat.S_ISDIR(mode):
                    return None
                fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
            return action(fds[-1], parts[-1])
        finally:
            for fd in fds:
                os.close(fd)

    def _left(self, files: dict[str, Stamp], remove: bool = False) -> list[str]:
        """Which recorded ``files`` are there, each reached through :meth:`_at` (``remove``: and
        unlinked through the descriptor of its folder, right after its check); refused in one line
        when one is there but is not the regular file the run left (another size or modification
        time; for an older record, newer than the record)."""
        record = self.path / RECORD_NAME
        record_time = os.lstat(record).st_mtime_ns if os.path.lexists(record) else 0

        def visit(fd: int, base: str, name: str, stamp: Stamp) -> bool:
            try:
                info = os.stat(base, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            left = _stamp(info) == stamp if stamp is not None else info.st_mtime_ns <= record_time
            if not (stat.S_ISREG(info.st_mode) and left):
                raise self._refuse(
                    f"holds {name}, which an earlier run of locatdino {self.command} wrote but which has changed "
                    f"since (its size, modification time or kind): move it away or choose another {self.option} "
                    "(a run removes only the files it wrote, as it left them)"
                )
            if remove:
                os.unlink(base, dir_fd=fd)
            return True

        return [name for name, stamp in files.items() if self._at(name, partial(visit, name=name, stamp=stamp))]

    def earlier(self) -> list[str]:
        """The files of an earlier run still in the folder (relative paths, as recorded); refused in
        one line when the record is damaged or a recorded file has changed since."""
        return self._left(self.recorded()[1])

    def check(self, planned: Iterable[str | os.PathLike], overwrite: bool) -> None:
        """Refuse, in one line and before any work, a folder this run may not write into: a file,
        one holding another command's output, an earlier run's output without ``overwrite``, or a
        file of ``planned`` (relative paths this run writes; ``"name/"``: every file under that
        sub-folder) that no run recorded; and one that cannot be written."""
        if self.path.exists() and not self.path.is_dir():
            raise self._refuse("is a file, not a folder")
        command, recorded = self.recorded()
        if command is not None and command != self.command:
            raise self._refuse(f"holds the output of locatdino {command}: choose another {self.option}")
        earlier = self.earlier()
        if earlier and not overwrite:
            raise self.earlier_output(earlier)
        for name in self._existing(planned):
            if name not in recorded:
                raise self._refuse(
                    f"holds {name}, which locatdino {self.command} did not write: move it or choose "
                    f"another {self.option} (a run replaces only files it wrote)"
                )
        self._check_writable()

    def _check_writable(self) -> None:
        """Probe the folder, or where it will be created (a refused run creates no folder)."""
        if self.path.is_dir():
            try:
                ensure_writable(self.path, self.option)
            except OSError as err:
                raise UserError(str(err)) from None
            return
        base = next(p for p in self.path.absolute().parents if p.exists())
        if not base.is_dir():
            raise self._refuse(f"cannot be created: {base} is a file")
        if not os.access(base, os.W_OK | os.X_OK):
            raise self._refuse(f"cannot be created: {base} is not writable")

    def _existing(self, planned: Iterable[str | os.PathLike]) -> Iterator[str]:
        """What of ``planned`` is already there: the files, a file where a sub-folder goes, every
        file under a ``"name/"`` entry."""
        for name in map(str, planned):
            target = self.path / name
            if name.endswith("/"):
                yield from (_relative(p.relative_to(self.path)) for p in sorted(target.rglob("*")) if not p.is_dir())
                continue
            for parent in reversed(PurePosixPath(_relative(name)).parents[:-1]):  # a file where a folder goes
                if (self.path / parent).exists() and not (self.path / parent).is_dir():
                    yield _relative(parent)
            if os.path.lexists(target):
                yield _relative(name)

    @contextlib.contextmanager
    def writing(self, overwrite: bool) -> Iterator[OutputFolder]:
        """Hold the folder's lock for the block (a second run into it is refused at once), remove
        the earlier run's recorded files (``overwrite``, after :meth:`check`) and killed writes'
        temporaries, and start this run's record."""
        with output_lock(self.path, self.option):
            for folder in [self.path, *(p for p in self.path.iterdir() if p.is_dir() and not p.is_symlink())]:
                remove_stale_temporaries(folder)  # a run's sub-folders too (one per model)
            if overwrite:
                self._remove_earlier()
            self._written = {}
            self._save()
            yield self

    def _remove_earlier(self) -> None:
        files = self.recorded()[1]
        self._left(files)  # every file checked before the first is removed
        folders = set()
        for name in self._left(files, remove=True):
            folders.update(self.path / parent for parent in PurePosixPath(name).parents[:-1])
        for folder in sorted(folders, key=lambda f: len(f.parts), reverse=True):  # the deepest first
            with contextlib.suppress(OSError):  # kept when it holds anything else
                folder.rmdir()

    def _save(self) -> None:
        files = {name: {"size": size, "mtime_ns": mtime} for name, (size, mtime) in self._written.items()}
        atomic_write_text(
            self.path / RECORD_NAME, json.dumps({"command": self.command, "files": files}, indent=1) + "\n"
        )

    def wrote(self, *paths: str | os.PathLike) -> None:
        """Record files this run has written (paths inside the folder, absolute or relative to it),
        each with its size and modification time as it is now: call it again after rewriting one.
        A path that is not there (an output a run may leave out), is not a regular file, or is
        reached through a symbolic link inside the folder is not recorded, so never removed."""
        before = dict(self._written)
        for path in map(Path, paths):
            if not os.path.lexists(path if path.is_absolute() or path.is_relative_to(self.path) else self.path / path):
                continue
            if path.is_relative_to(self.path):
                path = path.relative_to(self.path)
            elif path.is_absolute():
                path = path.resolve().relative_to(self.path.resolve())
            name = _relative(path)
            if _not_recordable(name) is not None:
                raise ValueError(f"{name!r} cannot be recorded as a file of {self.path}: {_not_recordable(name)}")
            with contextlib.suppress(UserError):  # reached through a link: not recorded
                info = self._at(name, lambda fd, base: os.stat(base, dir_fd=fd, follow_symlinks=False))
                if info is not None and stat.S_ISREG(info.st_mode):
                    self._written[name] = _stamp(info)
        if self._written != before:
            self._save()

    def write_text(self, name: str | os.PathLike, text: str) -> Path:
        """Write ``text`` to ``name`` in the folder atomically and record it."""
        path = atomic_write_text(self.path / name, text)
        self.wrote(path)
        return path


def _mark(command: str) -> str:
    return f"<!-- written by locatdino {command} -->\n"


def check_output_file(path: str | os.PathLike, command: str, overwrite: bool, option: str) -> None:
    """The rule for a command's single text output (``hbird report --summary FILE``): the file
    carries its writer's mark on its last line (:func:`write_output_file`); an existing one is
    replaced only with ``overwrite`` and the mark of ``command``."""
    path = Path(path)
    if not os.path.lexists(path):
        return
    mark = _mark(command).encode()
    ours = path.is_file() and path.stat().st_size >= len(mark)
    if ours:
        with open(path, "rb") as f:
            f.seek(-len(mark), os.SEEK_END)
            ours = f.read() == mark
    if not ours:
        raise UserError(f"{option} {path} exists and was not written by locatdino {command}: choose another file")
    if not overwrite:
        raise UserError(
            f"{option} {path} holds the output of an earlier run: pass --overwrite to replace it, or "
            f"choose another {option}"
        )


def write_output_file(path: str | os.PathLike, command: str, text: str) -> Path:
    """Write ``text`` to ``path`` atomically, with ``command``'s mark as its last line."""
    return atomic_write_text(path, text.rstrip("\n") + "\n\n" + _mark(command))
