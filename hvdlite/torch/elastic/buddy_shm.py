"""Buddy copies between ranks that share memory (one machine, one /dev/shm): the owner packs its
shard straight into a file in /dev/shm that its buddy keeps mapped, so the buddy's copy costs no
bytes moved and no memory of its own (hvdlite/torch/elastic/buddy.py decides when to use this).

Why it is a copy: a rank that dies (SIGKILL, a crash) loses its private memory, but the pages
of a file its buddy still maps stay readable by the buddy; a failure that takes the machine
takes the buddy too, as it would take a copy in the buddy's private memory. The elastic driver
drops a failed worker's host whole, so ranks sharing /dev/shm are lost together anyway unless the
launcher calls them different hosts.

Layout of a file: an int64 commit version at byte 0 (0: being packed, no complete copy), the
shard's elements from byte HEADER_BYTES on. The owner writes 0, packs, then writes the version;
the buddy reads the version only after a collective that the owner passed after its write (or
after the owner died), so it never takes a half-packed copy for a complete one.

Lifetime: the owner creates and fills its files with posix_fallocate (a full /dev/shm is an error
here, not a SIGBUS later), the buddy maps them, and the owner unlinks them once every buddy has
mapped its files (buddy.py's agreement): from then on the pages live exactly as long as a mapping
does. Names start with the job's shared-memory tag, so the launcher removes what a job killed
in between leaves behind (hvdlite/runner/jobenv.py remove_shm_leftovers).

Threading: the training thread.
"""

import mmap
import os
import secrets

import torch

from hvdlite.common import exceptions, settings
from hvdlite.common import job as jobs

HEADER_BYTES = 4096  # the version, padded to a page: the elements start page-aligned
SHM_DIR = "/dev/shm"


def share_key():
    """What ranks seeing the same /dev/shm files have in common (boot id, the directory's device
    and inode), or None when this rank shares none (HVDLITE_BUDDY_SHARED_MEMORY=0, no /dev/shm)."""
    if not settings.get("BUDDY_SHARED_MEMORY") or settings.get("SHM_DISABLE"):
        return None
    try:
        st = os.stat(SHM_DIR)
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return None
    return (boot, st.st_dev, st.st_ino)


def name_prefix(uid):
    """A fresh name prefix for this rank's files of BuddyCopies number `uid`."""
    tag = "hvdlite-" + secrets.token_hex(8)
    try:
        secret = bytes.fromhex(settings.get("SECRET"))
        if secret:  # the launcher's cleanup tag
            tag = jobs.shm_tag(secret)
    except ValueError:
        pass
    return "%s-buddy%d-p%d-%s" % (tag, uid, os.getpid(), secrets.token_hex(4))


class SharedShard:
    """One shard copy in a /dev/shm file: `data` (1-D, numel elements of dtype) and its version.
    create=True makes the file (error if it exists) and backs every page; create=False maps an
    existing one of exactly that size. Raises OSError when either fails (PreconditionError where the
    existing file has another size)."""

    def __init__(self, name, numel, dtype, create):
        self.path = os.path.join(SHM_DIR, name)
        itemsize = torch.empty(0, dtype=dtype).element_size()
        size = HEADER_BYTES + numel * itemsize
        fd = os.open(self.path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError:
                    self.unlink()
                    raise
            elif os.fstat(fd).st_size != size:
                raise exceptions.PreconditionError(
                    "buddy copy %s has %d bytes, not %d" % (self.path, os.fstat(fd).st_size, size)
                )
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._version = torch.frombuffer(self._map, dtype=torch.int64, count=1)
        self.data = torch.frombuffer(self._map, dtype=dtype, count=numel, offset=HEADER_BYTES)

    @property
    def version(self):
        return int(self._version[0])

    @version.setter
    def version(self, value):
        self._version[0] = value

    def unlink(self):
        """Removes the name (the pages stay while mapped); gone already is fine."""
        try:
            os.unlink(self.path)
        except OSError:
            pass
