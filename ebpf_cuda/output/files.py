"""Files opened for writing safely: another user's symbolic link is never followed (the /tmp
symlink attack on a tracer run as root), stdout stands for no path."""
import os
import stat
import sys
from typing import IO, Optional

from ..errors import UsageError


def open_output(path: Optional[str], stdout_closed: bool = False) -> IO[str]:
    """The file to write (created with the user's umask), or stdout for None; a symbolic
    link is followed only when it belongs to us or to root, so that root cannot be tricked
    into overwriting a file through another user's link (the /tmp symlink attack)."""
    if path is None:
        if stdout_closed:
            raise UsageError("stdout is closed: give the events a file with -o FILE")
        return sys.stdout
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    try:
        if not trusted_symlink(path):
            flags |= os.O_NOFOLLOW  # not a link, and one swapped in meanwhile fails (ELOOP)
        return os.fdopen(os.open(path, flags, 0o666), "w", buffering=1 << 16)
    except OSError as err:
        raise UsageError("cannot write %s: %s" % (path, err.strerror)) from None


def open_binary(path: str) -> IO[bytes]:
    """A file to write bytes to, opened as `open_output` opens one (the same link rule)."""
    return open_output(path).detach()


def trusted_symlink(path: str) -> bool:
    """True if `path` is a symbolic link owned by us or root; UsageError if another user's."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISLNK(st.st_mode):
        return False
    if st.st_uid not in (os.geteuid(), 0):
        raise UsageError("refusing to write %s: it is a symbolic link owned by another user "
                         "(uid %d)" % (path, st.st_uid))
    return True
