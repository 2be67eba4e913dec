//! Helpers for tests, shared by the crate's unit tests and `tests/`.
//!
//! Not part of the public API: hidden from the docs and free to change.

pub mod faulty_vfs;
pub mod fuzzing;
