"""The files the commands write: never one of their inputs (the same file however spelt,
even with --overwrite), never anything but a regular file (a device, a FIFO, a socket, a
directory: even with --overwrite), never an existing file of another kind without
--overwrite, and each written whole (to a temporary beside it, then renamed), so that a
refused or failed command leaves every file as it was."""
import os
import stat
import tempfile

from . import UsageError

OVERWRITE = "--overwrite"
OVERWRITE_HELP = ("replace an existing output that is not a file this command writes (an input is never replaced, "
                  "even with --overwrite) (default: off)")


def same_file(a, b):
    """Whether two paths name one file: the same inode when both exist, else the same real path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_not_input(flag, path, inputs):
    """Refuses an output that is one of the inputs ((flag, path) pairs)."""
    for in_flag, in_path in inputs:
        if in_path and same_file(path, in_path):
            raise UsageError(f"{flag} {path}: the same file as {in_flag} {in_path} (an input is never overwritten, "
                             f"even with {OVERWRITE}; give another file)")


# What stat calls the things an output may not replace: renaming a file onto /dev/null
# (as root) or a FIFO would destroy it, and reading one to tell its kind could block.
SPECIAL = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
           (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def check_regular(flag, path):
    """Refuses (exit 2, even with --overwrite) an output path that exists and is not a regular
    file (a symbolic link judged by what it points at); returns whether it exists. Only stat:
    nothing is opened."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot be examined ({e.strerror})")
    if stat.S_ISREG(mode):
        return True
    kind = next((name for test, name in SPECIAL if test(mode)), "not a regular file")
    if os.path.islink(path):
        kind += f" (a symbolic link to {os.path.realpath(path)})"
    raise UsageError(f"{flag} {path}: is {kind}, not a regular file (an output must be a new file or a regular "
                     f"one; refused even with {OVERWRITE}; give a file name)")


def check_output(flag, path, inputs, own_kind, what, overwrite):
    """Refuses an output that is an input, anything but a regular file (check_regular), or
    (without --overwrite) an existing non-empty file that own_kind(path) does not recognise
    as one this command writes (`what`)."""
    check_not_input(flag, path, inputs)
    if check_regular(flag, path) and os.path.getsize(path) and not overwrite and not own_kind(path):
        raise UsageError(f"{flag} {path}: exists and is not {what}; give {OVERWRITE} to replace it, or another file")


def write_whole(flag, path, write, binary=False):
    """Calls write(file object) on a temporary beside path, then renames it to path: an
    error leaves path as it was. Refuses (exit 2) a path that cannot be written, or that is
    not a regular file (made one since the command checked it)."""
    folder = os.path.dirname(path) or "."
    check_regular(flag, path)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot be written ({e.strerror})")
    try:
        with os.fdopen(fd, "wb" if binary else "w") as fh:
            write(fh)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot be written ({e.strerror})")
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def input_files(inputs, flag):
    """The (flag, path) pairs of every file the inputs read: the paths given and the results
    files that their tables list."""
    pairs = [(flag, p) for p in inputs.given]
    pairs += [(f"{flag} (listed)", s.path) for s in inputs.sources if s.path]
    return pairs
