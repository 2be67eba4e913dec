//! Provider tests (being written).
