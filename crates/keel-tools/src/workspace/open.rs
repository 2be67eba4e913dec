//! Opening a file through the handle of its directory, the one way the
//! file tools and the workspace record read a file by name.

use std::ffi::OsStr;
use std::io;

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt as _};
use cap_std::fs::{Dir, File, OpenOptions, OpenOptionsExt as _};

/// Opens `name` in `dir` for reading, without following a link there and
/// without blocking on a FIFO that may have been swapped in.
pub(super) fn open_file_in(dir: &Dir, name: &OsStr) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options
        .read(true)
        .follow(FollowSymlinks::No)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32);
    dir.open_with(name, &options)
}
