//! Benchmark workloads, shared by `keel bench` and `cargo bench`.
//!
//! - [`turns`]: the runtime-neutral "durable streaming agent turns" workload
//!   (the one LangGraph is measured with: S sessions × T turns of K
//!   streamed chunks of B bytes, every chunk persisted), run through the
//!   real agent runtime;
//! - [`length`]: the same turns in one long session, to show that a
//!   turn's cost does not grow with its session's length;
//! - [`memory`]: what a loaded idle session and an idle event stream cost
//!   in a real `keel serve` process's memory;
//! - [`recorder`]: durable events per second through the event recorder, with
//!   and without group commit;
//! - [`serve`]: the same turns driven over `keel serve`'s HTTP API and event
//!   streams, with many subscribers and a stalled one, and with each kind of
//!   credential ([`auth`]), and through the front-end protocols' streams
//!   ([`frontends`]);
//! - [`tail`]: reading near the end of a long log against reading its
//!   newest page;
//! - [`cluster`]: those turns across several `keel serve` nodes on one
//!   PostgreSQL database, requests and streams on random nodes.
//!
//! All run on a real database with the durable defaults (SQLite's
//! `synchronous=FULL`, PostgreSQL's `synchronous_commit = on`), because
//! the commit to disk is what they measure: a temporary SQLite file by
//! default, or a PostgreSQL database given by URL ([`BenchDatabase`]).
//!
//! Nothing but the `keel` command and the benches depends on this crate: the
//! runtime must not know it is measured.

pub mod auth;
pub mod cluster;
mod database;
pub mod frontends;
mod http;
pub mod length;
pub mod memory;
mod process;
pub mod recorder;
pub mod serve;
mod stats;
pub mod tail;
pub mod turns;
mod webhook_sink;

pub use database::BenchDatabase;
pub use stats::{median, peak_rss_mib, percentile, process_cpu_s};
