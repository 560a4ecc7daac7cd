"""A test-owned ext4 filesystem on a loop device, for power cuts and full disks.

The tests that use it run as root (losetup, mount). Without loop devices or ``mkfs.ext4``
they fail with a message saying what is missing: never skipped.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

#: ``_IOR('X', 125, __u32)`` and its "no log flush" flag, from linux/ext4.h.
EXT4_IOC_SHUTDOWN = 0x8004587D
EXT4_GOING_FLAGS_NOLOGFLUSH = 2


def _run(*argv: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()} -- the "
            "power-cut tests need root, loop devices (/dev/loop-control) and mkfs.ext4 "
            "(Debian: e2fsprogs); they are never skipped"
        )
    return proc.stdout


@attrs.define
class Ext4:
    """A test-owned ext4 filesystem on a loop device: cut, unmounted and mounted again.

    The loop device is attached and detached explicitly (not ``mount -o loop``), and each
    mount gets a device freshly attached: nothing of the cut filesystem stays cached in a
    block device that the next mount would read.
    """

    image: Path
    mount: Path
    size_mb: int = 96
    device: str | None = None

    def make(self) -> None:
        if os.geteuid() != 0:
            pytest.fail("the power-cut tests mount a loop device: they must run as root")
        if shutil.which("mkfs.ext4") is None:
            pytest.fail("mkfs.ext4 is missing (Debian: apt-get install e2fsprogs)")
        if not os.path.exists("/dev/loop-control"):
            pytest.fail("no loop devices here (/dev/loop-control is missing)")
        with open(self.image, "wb") as f:
            f.truncate(self.size_mb << 20)
        _run("mkfs.ext4", "-q", "-F", str(self.image))
        self.mount.mkdir(parents=True, exist_ok=True)
        self.attach()

    def attach(self) -> None:
        self.device = _run("losetup", "--find", "--show", str(self.image)).strip()
        _run("mount", "-o", "commit=60", self.device, str(self.mount))

    def cut(self) -> None:
        """A power cut: what the journal has not committed is gone."""
        fd = os.open(self.mount, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
        finally:
            os.close(fd)

    def detach(self) -> None:
        if self.device is None:
            return
        _run("umount", str(self.mount))
        _run("losetup", "--detach", self.device)
        self.device = None

    def remount(self) -> None:
        self.detach()
        self.attach()


@contextlib.contextmanager
def ext4_filesystem(
    directory: Path, size_mb: int = 96, *, mount: Path | None = None
) -> Iterator[Ext4]:
    """A new ext4 filesystem mounted at ``mount`` (default ``directory/mnt``), its image in
    ``directory``; unmounted and detached after."""
    fs = Ext4(directory / "disk.img", mount or directory / "mnt", size_mb)
    try:
        fs.make()
        yield fs
    finally:
        if fs.device is not None:
            subprocess.run(["umount", "-l", str(fs.mount)], check=False)
            subprocess.run(["losetup", "--detach", fs.device], check=False)
