//! Test modules, one per area.

mod agent;
mod cli;
mod support;
