//! Extractors whose failures answer with the API's JSON errors.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON body. It must be sent as `application/json` (or
/// `application/*+json`), else `415 unsupported_media_type`: the types a
/// browser sends cross-site without a preflight (`text/plain`, forms) are
/// refused, so no page of another site can post to the API. A body over the
/// limit is `413 too_large`, anything unparsable `400 invalid_request`. An
/// empty body sent without a content type (or as JSON) reads as `{}`.
pub(crate) struct ApiJson<T>(pub(crate) T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        JsonBody::from_request(request, state).await?.parse().map(ApiJson)
    }
}

/// A JSON object body, checked as [`ApiJson`] checks it but not read yet:
/// for a route that must refuse a request (a missing scope, say) the same
/// way whatever its body holds, and only then read it.
pub(crate) struct JsonBody(Bytes);

impl JsonBody {
    /// The body as a `T` (which may borrow its strings from it); `400
    /// invalid_request` when it is not one.
    pub(crate) fn parse<'a, T: Deserialize<'a>>(&'a self) -> Result<T, ApiError> {
        serde_json::from_slice(&self.0).map_err(|error| ApiError::InvalidRequest(format!("invalid JSON body: {error}")))
    }
}

impl<S> FromRequest<S> for JsonBody
where
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let declared_json = match request.headers().get(header::CONTENT_TYPE) {
            Some(value) if is_json(value) => true,
            Some(_) => return Err(not_json()),
            None => false,
        };
        let bytes = Bytes::from_request(request, state).await.map_err(body_error)?;
        // No body is the empty object. White space sent as JSON is not
        // JSON (the description's media type says it must parse), so it
        // is refused like any other text that does not.
        let blank = bytes.is_empty() || (!declared_json && bytes.iter().all(u8::is_ascii_whitespace));
        if !blank && !declared_json {
            return Err(not_json());
        }
        let bytes = if blank { Bytes::from_static(b"{}") } else { bytes };
        // Every body of this API is an object (or, where it may be left
        // out, `null`): serde would read a struct from an array too.
        let text = bytes.trim_ascii_start();
        if !text.starts_with(b"{") && text.trim_ascii_end() != b"null" {
            return Err(ApiError::InvalidRequest(
                "invalid JSON body: the body must be a JSON object".to_owned(),
            ));
        }
        Ok(JsonBody(bytes))
    }
}

/// Whether a `Content-Type` names JSON: `application/json` or
/// `application/<anything>+json`, parameters (`; charset=utf-8`) allowed.
fn is_json(value: &HeaderValue) -> bool {
    let Ok(value) = value.to_str() else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|subtype| subtype.len() > "+json".len() && subtype.ends_with("+json"))
}

fn not_json() -> ApiError {
    ApiError::UnsupportedMediaType("send the body as JSON with 'Content-Type: application/json'".to_owned())
}

fn body_error(rejection: BytesRejection) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::TooLarge("the request body is over the server's limit".to_owned())
    } else {
        ApiError::InvalidRequest(format!("cannot read the request body: {}", rejection.body_text()))
    }
}

/// Query parameters; unknown or malformed ones are `400 invalid_request`.
pub(crate) struct ApiQuery<T>(pub(crate) T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::try_from_uri(&parts.uri)
            .map(|axum::extract::Query(value)| ApiQuery(value))
            .map_err(|rejection| ApiError::InvalidRequest(format!("invalid query: {}", rejection.body_text())))
    }
}

/// Deserializes an optional sequence or time that must fit in a signed
/// 64-bit integer: the description says `int64` (the format JSON Schema
/// tools know), so a larger number is refused rather than read.
pub(crate) fn int64<'de, D>(deserializer: D) -> Result<Option<u64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let value = <Option<u64> as serde::Deserialize>::deserialize(deserializer)?;
    match value {
        Some(number) if i64::try_from(number).is_err() => Err(serde::de::Error::custom(format!(
            "{number} is over the largest accepted value, {}",
            i64::MAX
        ))),
        other => Ok(other),
    }
}

/// An optional nested object of a body, refused when it is anything but an
/// object or `null`: serde reads a struct from an array too, which the
/// description does not allow (`[]` would be a struct of defaults).
pub(crate) fn object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: DeserializeOwned,
{
    use serde::de::Error as _;
    let Some(map) =
        <Option<serde_json::Map<String, serde_json::Value>> as serde::Deserialize>::deserialize(deserializer)?
    else {
        return Ok(None);
    };
    serde_json::from_value(serde_json::Value::Object(map))
        .map(Some)
        .map_err(D::Error::custom)
}

/// An optional field that may be left out but is never `null`, so that
/// "at least one of" bodies mean what the description says.
pub(crate) fn not_null<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// [`int64`] for a JSON body: JSON Schema counts `5.0` as the integer 5,
/// so an integral number in either spelling is read.
pub(crate) fn json_int64<'de, D>(deserializer: D) -> Result<Option<u64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::de::Error as _;
    let Some(number) = <Option<serde_json::Number> as serde::Deserialize>::deserialize(deserializer)? else {
        return Ok(None);
    };
    let integral = number.as_u64().or_else(|| {
        number
            .as_f64()
            .filter(|float| float.fract() == 0.0 && (0.0..=i64::MAX as f64).contains(float))
            .map(|float| float as u64)
    });
    match integral {
        Some(value) if i64::try_from(value).is_ok() => Ok(Some(value)),
        _ => Err(D::Error::custom(format!(
            "{number} is not an integer from 0 to {}",
            i64::MAX
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Body {
        #[serde(default, deserialize_with = "json_int64")]
        at: Option<u64>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Defaults {
        #[serde(default)]
        a: Option<bool>,
    }

    #[derive(serde::Deserialize)]
    struct Outer {
        #[serde(default, deserialize_with = "object")]
        inner: Option<Defaults>,
    }

    #[tokio::test]
    async fn no_body_is_the_empty_object_and_white_space_sent_as_json_is_refused() {
        async fn read(body: &'static str, json: bool) -> Result<serde_json::Value, ApiError> {
            let mut request = axum::http::Request::builder().method("POST").uri("/");
            if json {
                request = request.header(header::CONTENT_TYPE, "application/json");
            }
            let request = request.body(axum::body::Body::from(body)).expect("a request");
            ApiJson::<serde_json::Value>::from_request(request, &())
                .await
                .map(|ApiJson(value)| value)
        }
        assert_eq!(read("", true).await.ok(), Some(serde_json::json!({})));
        assert_eq!(read("", false).await.ok(), Some(serde_json::json!({})));
        assert_eq!(read(" ", false).await.ok(), Some(serde_json::json!({})));
        for body in ["\t", " ", "\n\n"] {
            assert!(
                matches!(read(body, true).await, Err(ApiError::InvalidRequest(_))),
                "{body:?}"
            );
        }
    }

    #[test]
    fn a_nested_object_is_an_object_or_null_never_an_array() {
        let read = |json: &str| serde_json::from_str::<Outer>(json).map(|outer| outer.inner.is_some());
        assert_eq!(read(r#"{"inner": {"a": true}}"#).ok(), Some(true));
        assert_eq!(read(r#"{"inner": null}"#).ok(), Some(false));
        assert_eq!(read("{}").ok(), Some(false));
        for refused in [r#"{"inner": []}"#, r#"{"inner": [true]}"#, r#"{"inner": 1}"#] {
            assert!(read(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn a_json_integer_reads_in_either_spelling_and_within_int64() {
        let read = |json: &str| serde_json::from_str::<Body>(json).map(|body| body.at).ok();
        assert_eq!(read(r#"{"at": 7}"#), Some(Some(7)));
        assert_eq!(read(r#"{"at": 7.0}"#), Some(Some(7)));
        assert_eq!(read(r#"{"at": null}"#), Some(None));
        assert_eq!(read("{}"), Some(None));
        for refused in [
            r#"{"at": 7.5}"#,
            r#"{"at": -1}"#,
            r#"{"at": "7"}"#,
            r#"{"at": 9223372036854775808}"#,
        ] {
            assert_eq!(read(refused), None, "{refused}");
        }
    }

    #[test]
    fn only_json_types_are_json() {
        for json in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/merge-patch+json",
        ] {
            assert!(is_json(&HeaderValue::from_static(json)), "{json}");
        }
        for other in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "text/json",
            "application/+json",
            "application/jsonp",
            "",
        ] {
            assert!(!is_json(&HeaderValue::from_static(other)), "{other}");
        }
    }
}
