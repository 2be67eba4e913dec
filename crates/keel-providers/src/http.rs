//! HTTP for providers: one pooled client, streamed SSE bodies with an idle
//! timeout and a size bound, error bodies turned into messages, and retries
//! with exponential back-off and jitter that honour `Retry-After`, but only
//! while nothing of the response has reached the sink.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use rand::RngExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::ProviderError;
use super::sse::{SseEvent, SseParser};
use keel_protocol::Error;
use keel_secrets::{redact, redact_owned, register};

/// Timeouts, size bounds and retries of provider requests.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Time to establish a connection.
    pub connect_timeout: Duration,
    /// Time from sending the request to receiving the response headers
    /// (`response_timeout_secs`).
    pub response_timeout: Duration,
    /// The longest a model step may take, every attempt, back-off and the
    /// whole stream included (`step_timeout_secs`): bounds a server that
    /// accepts and never answers across retries, and a stream that sends
    /// only keep-alives, which the idle timeout never ends.
    pub step_timeout: Duration,
    /// Longest silence allowed between two pieces of a streamed body.
    pub idle_timeout: Duration,
    /// Largest single SSE event (a line or its joined data).
    pub max_event_bytes: usize,
    /// Largest response body, streamed or not.
    pub max_response_bytes: usize,
    /// When and how often to try again.
    pub retry: RetryPolicy,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            response_timeout: Duration::from_secs(120),
            // Long enough for a long answer of a slow local model.
            step_timeout: Duration::from_secs(30 * 60),
            // Reasoning models can think for minutes without sending text;
            // providers send keep-alives, so long silence means trouble.
            idle_timeout: Duration::from_secs(300),
            max_event_bytes: 16 * 1024 * 1024,
            max_response_bytes: 64 * 1024 * 1024,
            retry: RetryPolicy::default(),
        }
    }
}

/// Retries of a failed request.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Tries after the first one.
    pub max_retries: u32,
    /// The first back-off; it doubles with each retry.
    pub initial_backoff: Duration,
    /// The longest back-off.
    pub max_backoff: Duration,
    /// The longest `Retry-After` honoured; a longer one is not waited for.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 4,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(120),
        }
    }
}

impl RetryPolicy {
    /// How long to wait before retry number `retry` (from 0).
    fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(wait) = retry_after {
            return wait.min(self.max_retry_after);
        }
        let ceiling = self
            .initial_backoff
            .saturating_mul(2u32.saturating_pow(retry))
            .min(self.max_backoff);
        // Full jitter: spread retries of many clients over the whole window.
        let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(rand::rng().random_range(millis / 2..=millis.max(1)))
    }
}

/// Why one attempt failed.
#[derive(Debug)]
pub enum AttemptError {
    /// The provider failed; `streamed` says whether output had already
    /// reached the sink (then it is not retried: nothing is streamed twice).
    Provider {
        /// The failure.
        error: ProviderError,
        /// Whether output had reached the sink.
        streamed: bool,
    },
    /// A failure no retry can fix (for example the sink was closed).
    Fatal(Error),
}

impl From<Error> for AttemptError {
    fn from(error: Error) -> Self {
        AttemptError::Fatal(error)
    }
}

/// Runs `work` (a model step's attempts) within `settings.step_timeout`;
/// past it the step fails with [`ProviderError::Deadline`].
pub async fn within_step_deadline<T>(
    provider: &str,
    settings: &HttpSettings,
    work: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(settings.step_timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(Error::Provider(ProviderError::Deadline {
            provider: provider.to_owned(),
            after: settings.step_timeout,
        })),
    }
}

/// Runs `attempt` until it succeeds, fails for good, or retries run out. A
/// failure after retries is [`ProviderError::GaveUp`], which counts them.
pub async fn with_retries<T, F, Fut>(policy: &RetryPolicy, mut attempt: F) -> Result<T, Error>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, AttemptError>>,
{
    let mut retry = 0;
    loop {
        // The final error says how many requests were made.
        let gave_up = |error: ProviderError, retry: u32| {
            Error::Provider(if retry == 0 {
                error
            } else {
                ProviderError::GaveUp {
                    attempts: retry + 1,
                    last: Box::new(error),
                }
            })
        };
        match attempt(retry).await {
            Ok(value) => return Ok(value),
            Err(AttemptError::Provider { error, streamed: false })
                if error.is_retryable() && retry < policy.max_retries =>
            {
                let wait = policy.delay(retry, error.retry_after());
                if error.retry_after().is_some_and(|asked| asked > policy.max_retry_after) {
                    return Err(gave_up(error, retry));
                }
                tracing::warn!(%error, retry = retry + 1, wait_ms = wait.as_millis() as u64, "retrying the model request");
                tokio::time::sleep(wait).await;
                retry += 1;
            }
            Err(AttemptError::Provider { error, .. }) => return Err(gave_up(error, retry)),
            Err(AttemptError::Fatal(error)) => return Err(error),
        }
    }
}

/// A pooled HTTP client for one provider.
#[derive(Debug, Clone)]
pub struct HttpClient {
    client: reqwest::Client,
    provider: String,
    settings: HttpSettings,
}

impl HttpClient {
    /// A client for `provider` (the name used in error messages).
    pub fn new(provider: impl Into<String>, settings: HttpSettings) -> Result<Self, Error> {
        let client = reqwest::Client::builder()
            .connect_timeout(settings.connect_timeout)
            .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| Error::Config(format!("cannot build the HTTP client: {error}")))?;
        Ok(Self {
            client,
            provider: provider.into(),
            settings,
        })
    }

    /// The settings in use.
    pub fn settings(&self) -> &HttpSettings {
        &self.settings
    }

    /// The provider's name.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// POSTs `body` as JSON to `url` and returns the event stream of a
    /// successful response. An error status is read (bounded) into a
    /// [`ProviderError::Status`] carrying the provider's message.
    pub async fn post_events(
        &self,
        url: &str,
        headers: &[(String, Secret)],
        body: &serde_json::Value,
    ) -> Result<EventStream, ProviderError> {
        let mut header_map = HeaderMap::new();
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|error| self.request_error(error))?;
            let mut value = HeaderValue::from_str(value.expose()).map_err(|error| self.request_error(error))?;
            value.set_sensitive(value_is_secret(&name));
            header_map.insert(name, value);
        }
        header_map.insert(reqwest::header::ACCEPT, HeaderValue::from_static("text/event-stream"));
        let send = self.client.post(url).headers(header_map).json(body).send();
        let response = match tokio::time::timeout(self.settings.response_timeout, send).await {
            Err(_) => {
                return Err(ProviderError::Stalled {
                    provider: self.provider.clone(),
                    after: self.settings.response_timeout,
                });
            }
            Ok(Err(error)) => return Err(self.connection_error(&error)),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if !status.is_success() {
            let retry_after = retry_after(response.headers());
            let body = self.read_bounded(response, 64 * 1024).await.unwrap_or_default();
            return Err(ProviderError::Status {
                provider: self.provider.clone(),
                status: status.as_u16(),
                message: error_message(&body, status),
                retry_after,
            });
        }
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase();
        let media_type = content_type.split(';').next().unwrap_or_default().trim().to_owned();
        let mut complete = None;
        let mut response = Some(response);
        if let Some(answer) = response.take_if(|_| is_json(&media_type)) {
            // A complete, non-streamed answer (LiteLLM's `/v1/messages`
            // sends one): read whole, bounded, for the adapter to replay.
            let limit = self.settings.max_response_bytes;
            let body = self
                .read_bounded(answer, limit.saturating_add(1))
                .await
                .unwrap_or_default();
            if body.len() > limit {
                return Err(ProviderError::TooLarge {
                    provider: self.provider.clone(),
                    limit,
                });
            }
            let json = serde_json::from_slice(&body).map_err(|error| ProviderError::Malformed {
                provider: self.provider.clone(),
                message: format!("the JSON answer is not valid JSON: {error}"),
            })?;
            complete = Some(json);
        } else if !is_streamable(&media_type) {
            // An HTML page from a proxy or a login portal: no retry changes it.
            return Err(ProviderError::NotEventStream {
                provider: self.provider.clone(),
                content_type,
            });
        }
        let body: Pin<Box<dyn Stream<Item = reqwest::Result<bytes::Bytes>> + Send>> = match response {
            Some(response) => Box::pin(response.bytes_stream()),
            None => Box::pin(futures::stream::empty()),
        };
        Ok(EventStream {
            provider: self.provider.clone(),
            body,
            parser: SseParser::new(self.settings.max_event_bytes),
            ready: VecDeque::new(),
            idle_timeout: self.settings.idle_timeout,
            received: 0,
            max_bytes: self.settings.max_response_bytes,
            complete,
            failure: None,
        })
    }

    async fn read_bounded(&self, response: reqwest::Response, limit: usize) -> Option<Vec<u8>> {
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while let Ok(Some(Ok(chunk))) = tokio::time::timeout(self.settings.idle_timeout, stream.next()).await {
            let room = limit.saturating_sub(body.len());
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if body.len() >= limit {
                break;
            }
        }
        Some(body)
    }

    fn request_error(&self, error: impl std::fmt::Display) -> ProviderError {
        ProviderError::Request {
            provider: self.provider.clone(),
            message: format!("invalid request header: {error}"),
        }
    }

    fn connection_error(&self, error: &reqwest::Error) -> ProviderError {
        // The chain of sources says what actually failed (refused, reset, DNS).
        let mut message = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            message = format!("{message}: {cause}");
            source = cause.source();
        }
        ProviderError::Connection {
            provider: self.provider.clone(),
            message: redact_owned(message),
        }
    }
}

/// Whether a media type is JSON (a complete answer instead of a stream).
fn is_json(media_type: &str) -> bool {
    media_type == "application/json" || media_type.ends_with("+json")
}

/// Whether a successful answer of this media type is read as an event
/// stream: `text/event-stream`, and, for servers that label it loosely, no
/// type, `text/plain` or `application/octet-stream`.
fn is_streamable(media_type: &str) -> bool {
    matches!(
        media_type,
        "" | "text/event-stream" | "text/plain" | "application/octet-stream"
    )
}

/// A header value that must not appear in logs or debug output.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value` and registers it with [`keel_secrets`], so it is
    /// replaced in any text Keel stores or returns.
    pub fn new(value: impl Into<String>) -> Self {
        let value = value.into();
        register(&value);
        Self(value)
    }

    /// The value itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

fn value_is_secret(name: &HeaderName) -> bool {
    let name = name.as_str();
    name == "authorization" || name == "x-api-key" || name.contains("key") || name.contains("token")
}

/// The events of a streamed response body.
pub struct EventStream {
    provider: String,
    body: Pin<Box<dyn Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    parser: SseParser,
    ready: VecDeque<SseEvent>,
    idle_timeout: Duration,
    received: usize,
    max_bytes: usize,
    /// A complete JSON answer sent in place of a stream, until taken.
    complete: Option<serde_json::Value>,
    /// Why the body cannot be read further: returned once the events
    /// completed before the failure have been read, so what is delivered
    /// does not depend on how the network cut the bytes.
    failure: Option<ProviderError>,
}

impl EventStream {
    /// A stream over `chunks` already received (no connection): the body
    /// arrives in these pieces, or, with `complete`, a JSON answer sent in
    /// place of a stream. For the fuzzing entry points and tests, which
    /// drive a provider's decoder without HTTP.
    pub fn from_chunks(
        provider: &str,
        settings: &HttpSettings,
        chunks: Vec<bytes::Bytes>,
        complete: Option<serde_json::Value>,
    ) -> Self {
        let chunks = if complete.is_some() { Vec::new() } else { chunks };
        Self {
            provider: provider.to_owned(),
            body: Box::pin(futures::stream::iter(chunks.into_iter().map(Ok))),
            parser: SseParser::new(settings.max_event_bytes),
            ready: VecDeque::new(),
            idle_timeout: settings.idle_timeout,
            received: 0,
            max_bytes: settings.max_response_bytes,
            complete,
            failure: None,
        }
    }

    /// The complete JSON answer the server sent in place of an event
    /// stream, if it did. An adapter turns it into the events its stream
    /// would have had and gives them back with [`EventStream::replay`].
    pub fn take_complete(&mut self) -> Option<serde_json::Value> {
        self.complete.take()
    }

    /// Queues `events` to be read before anything else (the body of a
    /// complete answer is empty, so they are all there is).
    pub fn replay(&mut self, events: Vec<SseEvent>) {
        self.ready.extend(events);
    }

    /// The next event, or `None` when the body ended cleanly. A body that
    /// ends in the middle of an event is [`ProviderError::Truncated`]; one
    /// that goes silent for the idle timeout is [`ProviderError::Stalled`].
    pub async fn next(&mut self) -> Result<Option<SseEvent>, ProviderError> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Ok(Some(event));
            }
            if let Some(failure) = &self.failure {
                return Err(failure.clone());
            }
            if self.complete.is_some() {
                // Nobody turned the JSON answer into events.
                return Err(ProviderError::NotEventStream {
                    provider: self.provider.clone(),
                    content_type: "application/json".to_owned(),
                });
            }
            let chunk = match tokio::time::timeout(self.idle_timeout, self.body.next()).await {
                Err(_) => {
                    return Err(ProviderError::Stalled {
                        provider: self.provider.clone(),
                        after: self.idle_timeout,
                    });
                }
                Ok(None) if self.parser.has_partial_event() => {
                    return Err(ProviderError::Truncated {
                        provider: self.provider.clone(),
                    });
                }
                Ok(None) => return Ok(None),
                Ok(Some(Err(error))) => {
                    return Err(ProviderError::Connection {
                        provider: self.provider.clone(),
                        message: format!("the response body broke off: {error}"),
                    });
                }
                Ok(Some(Ok(chunk))) => chunk,
            };
            // Events up to the limit, or up to malformed bytes, are read
            // before the failure, however the bytes arrived.
            let room = self.max_bytes.saturating_sub(self.received);
            self.received = self.received.saturating_add(chunk.len());
            let mut events = Vec::new();
            let parsed = self.parser.push(&chunk[..chunk.len().min(room)], &mut events);
            self.ready.extend(events);
            if let Err(error) = parsed {
                self.failure = Some(ProviderError::Malformed {
                    provider: self.provider.clone(),
                    message: error.to_string(),
                });
            } else if chunk.len() > room {
                self.failure = Some(ProviderError::TooLarge {
                    provider: self.provider.clone(),
                    limit: self.max_bytes,
                });
            }
        }
    }
}

/// The wait a `Retry-After` (seconds or HTTP date) or `retry-after-ms`
/// header asks for.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    if let Some(millis) = headers.get("retry-after-ms").and_then(|value| value.to_str().ok())
        && let Ok(millis) = millis.trim().parse::<f64>()
    {
        return (millis.is_finite() && millis >= 0.0).then(|| Duration::from_secs_f64(millis / 1000.0));
    }
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(
        when.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// The provider's own message from an error body: OpenAI's
/// `{"error": {"message", "type", "code"}}`, Anthropic's `{"type": "error",
/// "error": {"type", "message"}}`, or other common shapes; the raw text
/// (shortened) otherwise. Keys are redacted (see [`keel_secrets`]): an
/// upstream may echo the request's headers.
pub fn error_message(body: &[u8], status: reqwest::StatusCode) -> String {
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(body)
        && let Some(message) = message_of(&json)
    {
        return message;
    }
    let text = String::from_utf8_lossy(body);
    // Before shortening, so no key is cut where the redaction misses it.
    let text = redact(&text);
    let text = text.trim();
    if text.is_empty() {
        return status.canonical_reason().unwrap_or("error").to_owned();
    }
    let mut shown: String = text.chars().take(500).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    shown
}

/// The message of a JSON error object, with its type or code in front;
/// keys redacted.
pub fn message_of(json: &serde_json::Value) -> Option<String> {
    message_of_raw(json).map(redact_owned)
}

fn message_of_raw(json: &serde_json::Value) -> Option<String> {
    let error = json.get("error").unwrap_or(json);
    if let Some(text) = error.as_str() {
        return Some(text.to_owned());
    }
    let message = error.get("message").or_else(|| error.get("detail"))?.as_str()?;
    let kind = error
        .get("type")
        .or_else(|| error.get("code"))
        .and_then(serde_json::Value::as_str);
    Some(match kind {
        Some(kind) if !kind.is_empty() && kind != "error" => format!("{kind}: {message}"),
        _ => message.to_owned(),
    })
}

#[cfg(test)]
mod tests;
