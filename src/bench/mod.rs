//! Benchmark workloads, shared by `keel bench` and `cargo bench`.
//!
//! - [`turns`]: the runtime-neutral "durable streaming agent turns" workload
//!   (the one LangGraph is measured with: S sessions × T turns of K
//!   streamed chunks of B bytes, every chunk persisted), run through the
//!   real agent runtime;
//! - [`recorder`]: durable events per second through the event recorder, with
//!   and without group commit;
//! - [`serve`]: the same turns driven over `keel serve`'s HTTP API and event
//!   streams, with many subscribers and a stalled one.
//!
//! All run on a real SQLite file with the durable default
//! (`synchronous=FULL`), because fsync is what they measure.

pub mod recorder;
pub mod serve;
mod stats;
pub mod turns;

pub use stats::{median, peak_rss_mib, percentile};
