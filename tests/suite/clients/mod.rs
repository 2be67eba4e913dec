//! The API's clients in `clients/`, each run by its own test suite against
//! the `keel` binary of this build.

mod python;
mod typescript;
