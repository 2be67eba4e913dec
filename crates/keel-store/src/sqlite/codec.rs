//! The store's value codec ([`crate::codec`]) in SQLite's types:
//! plain JSON as text, a compressed value as a blob.

use rusqlite::types::{Value, ValueRef};

use crate::codec::{self, Stored};

/// The stored form of `json`.
pub(super) fn encode(json: String) -> Value {
    match codec::encode(json) {
        Stored::Plain(json) => Value::Text(json),
        Stored::Compressed(bytes) => Value::Blob(bytes),
    }
}

/// The JSON bytes of a stored value, or why it is not one.
pub(super) fn decode(value: ValueRef<'_>) -> Result<Vec<u8>, String> {
    match value {
        ValueRef::Text(bytes) => Ok(bytes.to_vec()),
        // A compressed value, or plain JSON stored as a blob (written by
        // another tool), which is accepted.
        ValueRef::Blob(bytes) => codec::decode(bytes),
        other => Err(format!("expected JSON, found {}", other.data_type())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_are_text_and_large_ones_compressed_blobs() {
        let small = r#"{"a":1}"#.to_owned();
        assert_eq!(encode(small.clone()), Value::Text(small));
        let large = codec::json_array(vec![r#"{"turn_id":"0193-aaaa","delta":"x"}"#; 100]);
        let Value::Blob(blob) = encode(large.clone()) else {
            panic!("expected a compressed blob")
        };
        assert_eq!(decode(ValueRef::Blob(&blob)), Ok(large.into_bytes()));
        assert!(decode(ValueRef::Integer(42)).is_err());
    }
}
