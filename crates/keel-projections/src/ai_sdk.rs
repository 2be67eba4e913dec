//! The AI SDK's UI message stream, protocol v1.
