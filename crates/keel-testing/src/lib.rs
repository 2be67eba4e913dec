//! Helpers for tests, shared by the crates' unit tests and `tests/`: a
//! fault-injecting SQLite VFS and the fuzz targets' entry points.
//!
//! Not part of the public API: free to change. It is a dev-dependency only;
//! no crate that ships may depend on it.

pub mod faulty_vfs;
pub mod fuzzing;
