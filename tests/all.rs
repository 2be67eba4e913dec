//! Integration tests: one binary, one module per area (see `suite/`).

// `allow-expect-in-tests` does not reach helper functions of an integration
// test crate; here a failed expectation is a failed test.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod suite;
