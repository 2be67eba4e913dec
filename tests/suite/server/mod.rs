//! `keel serve` over real HTTP on loopback: the in-process server on a
//! `127.0.0.1:0` listener, and the binary as a process where restarts and
//! signals matter. Real SQLite files, the scripted model, no mocks.

mod audit;
mod auth;
mod bots;
mod budgets;
mod ceiling;
mod cluster;
mod errors;
mod fork;
mod framing;
mod front_door;
mod label_bounds;
mod lifecycle;
mod models;
mod ops;
mod policies;
mod retire;
mod sandbox_escape;
mod sessions;
mod streams;
mod traces;
mod usage;
mod webhooks;
mod workspaces;
mod writers;
mod ws;
