//! The `keel` command line.

fn main() {}
