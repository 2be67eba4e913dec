//! Recorder benchmarks.

fn main() {}
