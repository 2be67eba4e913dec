//! Signing deliveries as the Standard Webhooks specification says: an
//! HMAC-SHA256 of `{id}.{timestamp}.{body}` under each secret in use,
//! base64, sent as `webhook-signature: v1,<sig> v1,<sig>`, so that a
//! receiver holding either secret verifies during a rotation.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The prefix of a Standard Webhooks secret.
const SECRET_PREFIX: &str = "whsec_";

/// Why a secret cannot sign.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum SecretError {
    /// Not `whsec_` followed by base64 of 24 to 64 bytes.
    #[error("a webhook secret is `whsec_` followed by base64 of 24 to 64 bytes")]
    Malformed,
}

/// A secret's key bytes.
pub(crate) fn key_of(secret: &str) -> Result<Vec<u8>, SecretError> {
    let encoded = secret.strip_prefix(SECRET_PREFIX).ok_or(SecretError::Malformed)?;
    let key = STANDARD.decode(encoded).map_err(|_| SecretError::Malformed)?;
    if (24..=64).contains(&key.len()) {
        Ok(key)
    } else {
        Err(SecretError::Malformed)
    }
}

/// A new random secret, 32 bytes.
pub(crate) fn new_secret() -> String {
    let key: [u8; 32] = rand::random();
    format!("{SECRET_PREFIX}{}", STANDARD.encode(key))
}

/// The `webhook-signature` header for `body`, sent as message `id` at
/// `timestamp` (Unix seconds), signed with each of `keys`.
pub(crate) fn signature(keys: &[Vec<u8>], id: &str, timestamp: u64, body: &[u8]) -> String {
    keys.iter()
        // HMAC takes keys of any length: none is left out.
        .filter_map(|key| Hmac::<Sha256>::new_from_slice(key).ok())
        .map(|mut mac| {
            mac.update(id.as_bytes());
            mac.update(b".");
            mac.update(timestamp.to_string().as_bytes());
            mac.update(b".");
            mac.update(body);
            format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification's reference
    /// libraries (secret, id, timestamp, body and the signature they
    /// compute).
    #[test]
    fn signs_as_the_reference_libraries_do() {
        let key = key_of("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("key");
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            signature(&[key], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn every_secret_in_use_signs_and_malformed_ones_are_refused() {
        let (a, b) = (new_secret(), new_secret());
        let keys = [key_of(&a).expect("a"), key_of(&b).expect("b")];
        let both = signature(&keys, "msg_1", 1, b"{}");
        let parts: Vec<&str> = both.split(' ').collect();
        assert_eq!(
            parts,
            [
                signature(&keys[..1], "msg_1", 1, b"{}"),
                signature(&keys[1..], "msg_1", 1, b"{}")
            ]
        );
        for bad in [
            "",
            "whsec_",
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_!!!!",
            "whsec_c2hvcnQ=",
        ] {
            assert_eq!(key_of(bad), Err(SecretError::Malformed), "{bad}");
        }
    }
}
