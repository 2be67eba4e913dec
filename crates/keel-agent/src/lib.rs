//! Keel's agent runtime: the submission queue, the event recorder and the
//! turn loop behind an [`Agent`].

mod agent;

pub use agent::*;
