//! The AI SDK's UI message stream, protocol v1: a turn of the log as the
//! chunks `useChat` reads ([`Projection`]), and the body its
//! `DefaultChatTransport` posts read into ops ([`ChatRequest`]).

mod chunk;
mod projection;
mod request;
#[cfg(test)]
mod tests;

pub use chunk::{Chunk, DONE};
pub use projection::{Projection, Wait};
pub use request::{Answer, ChatRequest, Intent, RequestError, ToolPart, Trigger, UiMessage, answer_ops};
