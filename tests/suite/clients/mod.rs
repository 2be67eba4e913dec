//! The API clients in `clients/`, each tested by its own test runner
//! against this build's `keel serve`.

mod typescript;
