"""The package's one atomic-write helper and its output checks (``locatdino.common.output_files``)."""

import errno
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from locatdino.common import output_files
from locatdino.common.output_files import (
    DiskFullError,
    atomic_write_text,
    ensure_writable,
    make_temporary_dir,
    remove_stale_temporaries,
    reserve_space,
    temporary_sibling,
)
from locatdino.common.output_folder import OutputFolder
from locatdino.evaluation.hbird.memory import MemoryBank
from locatdino.ssl import atomic_torch_save
from tests.tiny_disk import python, run_on_tiny_disk


@pytest.fixture(params=[0o022, 0o002, 0o077])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _mode(path):
    return path.stat().st_mode & 0o777


def test_every_writer_honours_the_umask(tmp_path, umask):
    """Reports, checkpoints and memory banks get 0o666 / 0o777 & ~umask (tempfile's 0600 would
    hide them from colleagues)."""
    folder = OutputFolder(tmp_path / "run", "hbird")  # how every evaluation command writes its results
    folder.check(["results.json", "report.md"], overwrite=False)
    with folder.writing(overwrite=False):
        folder.write_text("results.json", "{}\n")
        folder.write_text("report.md", "# report\n")
    atomic_torch_save({"a": torch.ones(2)}, tmp_path / "ck" / "last.ckpt")
    bank = MemoryBank.allocate(4, 8, 3, directory=tmp_path / "bank")
    bank.append(torch.zeros(2, 8), torch.zeros(2, 3))
    bank.finish()
    files = [
        tmp_path / "run" / "results.json",
        tmp_path / "run" / "report.md",
        tmp_path / "ck" / "last.ckpt",
        tmp_path / "bank" / "features.bin",
        tmp_path / "bank" / "meta.json",
    ]
    assert [_mode(f) for f in files] == [0o666 & ~umask] * len(files)
    assert _mode(tmp_path / "bank") == _mode(make_temporary_dir(tmp_path / "x")) == 0o777 & ~umask


def test_failed_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "summary.md"
    atomic_write_text(path, "old")

    def fail(f):
        f.write(b"half")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        output_files.atomic_write(path, fail)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["summary.md"]


def test_a_disk_full_error_deep_in_a_chain_becomes_one_line(tmp_path):
    """torch.save reports ENOSPC as a RuntimeError chained to the OSError: the helper finds it."""

    def torch_like(f):
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as exc:
            raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64") from exc

    with pytest.raises(DiskFullError) as caught:
        output_files.atomic_write(tmp_path / "last.ckpt", torch_like)
    assert str(caught.value) == f"{tmp_path / 'last.ckpt'}: No space left on device (nothing was replaced)"
    assert os.listdir(tmp_path) == []
    assert output_files.disk_full_message(RuntimeError("x")) is None
    wrapped = RuntimeError("lightning")
    wrapped.__context__ = OSError(errno.ENOSPC, "No space left on device", "metrics.csv")
    assert output_files.disk_full_message(wrapped) == "metrics.csv: No space left on device"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_stale_temporaries_of_this_host_are_removed(tmp_path):
    dead, host = _dead_pid(), output_files._HOST
    stale_file = tmp_path / f".last.ckpt.{dead}@{host}.0123abcd.tmp"
    stale_dir = tmp_path / f".tmp-shards.{dead}@{host}.89abcdef.tmp"
    live = temporary_sibling(tmp_path / "last.ckpt")  # this process: a write in progress
    other_host = tmp_path / f".last.ckpt.{dead}@{host}x.0123abcd.tmp"  # a shared filesystem's other node
    keep = [live, other_host, tmp_path / ".last.ckpt.tmp", tmp_path / "last.ckpt"]
    for f in [stale_file, *keep]:
        f.write_text("x")
    stale_dir.mkdir()
    (stale_dir / "000000-0000.tar").write_text("x")
    assert sorted(remove_stale_temporaries(tmp_path)) == sorted([stale_file, stale_dir])
    assert sorted(tmp_path.iterdir()) == sorted(keep)
    assert remove_stale_temporaries(tmp_path / "missing") == []


def test_reserve_space_fails_up_front_in_one_line(tmp_path, monkeypatch):
    path = tmp_path / "features.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        reserve_space(fd, 4096, path)
        assert path.stat().st_size == 4096 and path.stat().st_blocks * 512 >= 4096  # really allocated

        def no_space(fd, offset, length):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "posix_fallocate", no_space)
        with pytest.raises(DiskFullError, match=r"features.bin: No space left on device: needs 1e\+03 GB, "):
            reserve_space(fd, 10**12, path)

        def unsupported(fd, offset, length):  # e.g. some network filesystems: compare the free space
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")

        monkeypatch.setattr(os, "posix_fallocate", unsupported)
        with pytest.raises(DiskFullError, match="No space left on device"):
            reserve_space(fd, 1 << 62, path)
        reserve_space(fd, 8192, path)
        assert path.stat().st_size == 8192
    finally:
        os.close(fd)


def test_ensure_writable_names_the_folder_in_one_line(tmp_path):
    assert ensure_writable(tmp_path / "a" / "b") == tmp_path / "a" / "b" and os.listdir(tmp_path / "a" / "b") == []
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError) as caught:
        ensure_writable(blocker / "out", "--out")
    assert str(caught.value).startswith(f"--out {blocker / 'out'} is not writable: ") and "Errno" not in str(
        caught.value
    )


_FULL_DISK_SCRIPT = r"""
import json, os, sys, torch
from locatdino.common.output_files import DiskFullError, atomic_write, atomic_write_text
from locatdino.evaluation.hbird.memory import MemoryBank
def atomic_torch_save(obj, path):  # locatdino.ssl's, without importing Lightning (seconds)
    atomic_write(path, lambda f: torch.save(obj, f))
disk = sys.argv[1]
out = {}
atomic_torch_save({"a": torch.ones(4)}, f"{disk}/last.ckpt")
for name, write in [("torch", lambda: atomic_torch_save({"a": torch.ones(1 << 18)}, f"{disk}/last.ckpt")),
                    ("text", lambda: atomic_write_text(f"{disk}/summary.md", "x" * (1 << 20))),
                    ("bank", lambda: MemoryBank.allocate(4096, 384, 21, directory=f"{disk}/bank"))]:
    try:
        write()
        out[name] = "written"
    except DiskFullError as err:
        out[name] = str(err)
out["kept"] = torch.load(f"{disk}/last.ckpt", weights_only=True)["a"].tolist()
out["left"] = sorted(os.listdir(disk))
print(json.dumps(out))
"""


@pytest.mark.slow
def test_full_disk_is_one_line_and_keeps_the_previous_file(tmp_path):
    """On a real 256 KiB tmpfs: torch's enforce message, a report and a 6 MB memory bank each end in
    one line naming the file; the old checkpoint is intact, no temporary or staging folder left."""
    disk = tmp_path / "disk"
    proc = run_on_tiny_disk(disk, "256k", python("-c", _FULL_DISK_SCRIPT, str(disk)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["torch"] == f"{disk}/last.ckpt: No space left on device (nothing was replaced)"
    assert out["text"] == f"{disk}/summary.md: No space left on device (nothing was replaced)"
    assert (
        out["bank"].startswith(f"{disk}/.bank.")
        and "features.bin: No space left on device: needs 0.00629 GB" in out["bank"]
    )
    assert out["kept"] == [1.0] * 4 and out["left"] == ["last.ckpt"]


def test_output_lock_refuses_a_second_holder_and_ends_with_its_holder(tmp_path):
    from locatdino.common.errors import UserError
    from locatdino.common.output_files import output_lock

    with output_lock(tmp_path / "out"):
        with pytest.raises(
            UserError, match=f"output folder {tmp_path / 'out'} is in use by another run \\(pid {os.getpid()} "
        ):
            with output_lock(tmp_path / "out"):
                pass
    script = (
        "import fcntl, os, sys, time; f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX); "
        "f.write(f'pid {os.getpid()} on elsewhere'); f.flush(); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "out" / ".locatdino.lock")], stdout=subprocess.PIPE, text=True
    )  # another run, holding the lock as output_lock does
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(UserError, match=f"\\(pid {holder.pid} on elsewhere; lock "):
            with output_lock(tmp_path / "out"):
                pass
    finally:
        holder.kill()  # a killed run leaves the folder free
        holder.wait()
    with output_lock(tmp_path / "out") as folder:
        assert (folder / ".locatdino.lock").read_text().startswith(f"pid {os.getpid()} on ")


def test_a_lock_held_by_what_an_ended_run_left_behind_says_so(tmp_path):
    """A run whose forked child (not one of the command's own workers, which close the lock) outlives
    it: the folder stays locked, and the refusal names the ended run instead of calling it running."""
    from locatdino.common.errors import UserError
    from locatdino.common.output_files import _HOST, output_lock

    lock = tmp_path / ".locatdino.lock"
    script = (
        "import fcntl, os, sys, time; f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX); "
        "f.write(f'pid {os.getpid()} on ' + sys.argv[2]); f.flush(); child = os.fork()\n"
        "if child == 0: time.sleep(60)\nelse: print(child, flush=True); os._exit(0)"
    )
    run = subprocess.Popen([sys.executable, "-c", script, str(lock), _HOST], stdout=subprocess.PIPE, text=True)
    child = int(run.stdout.readline())
    try:
        run.wait()
        with pytest.raises(
            UserError,
            match=f"^output folder {tmp_path} is locked by processes that the run with pid "
            f"{run.pid} left behind though it has ended \\(lock {lock}; `fuser {lock}` lists them\\): "
            "end them or choose another folder$",
        ):
            with output_lock(tmp_path):
                pass
    finally:
        os.kill(child, signal.SIGKILL)
