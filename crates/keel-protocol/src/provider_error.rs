//! Errors of model providers.

use std::time::Duration;

/// A provider request failed. The text names the provider and, where there is
/// one, the HTTP status and the provider's own message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The provider answered with an error status.
    #[error("{provider}: HTTP {status}: {message}")]
    Status {
        /// Which provider (as configured, for example `openai`).
        provider: String,
        /// The HTTP status.
        status: u16,
        /// The provider's message, from its error body.
        message: String,
        /// How long the provider asked us to wait (`Retry-After`).
        retry_after: Option<Duration>,
    },
    /// The provider reported an error inside the stream.
    #[error("{provider}: {message}")]
    Stream {
        /// Which provider.
        provider: String,
        /// The provider's message (with its error type or code when given).
        message: String,
        /// Whether the provider marked it as passing (overloaded, rate limited).
        retryable: bool,
    },
    /// The request could not be sent or the connection broke.
    #[error("{provider}: connection failed: {message}")]
    Connection {
        /// Which provider.
        provider: String,
        /// What went wrong.
        message: String,
    },
    /// No data arrived for too long.
    #[error("{provider}: the stream stalled: no data for {} s", .after.as_secs_f64())]
    Stalled {
        /// Which provider.
        provider: String,
        /// How long we waited.
        after: Duration,
    },
    /// The stream ended before the response was complete.
    #[error("{provider}: the stream ended before the response was complete")]
    Truncated {
        /// Which provider.
        provider: String,
    },
    /// The response could not be understood.
    #[error("{provider}: malformed response: {message}")]
    Malformed {
        /// Which provider.
        provider: String,
        /// What was wrong.
        message: String,
    },
    /// The response was larger than allowed.
    #[error("{provider}: the response exceeded {limit} bytes")]
    TooLarge {
        /// Which provider.
        provider: String,
        /// The limit.
        limit: usize,
    },
    /// A successful answer to a streamed request was neither an event
    /// stream nor a complete JSON answer (an HTML page from a proxy, say).
    #[error("{provider}: the answer is not an event stream (content type {content_type})")]
    NotEventStream {
        /// Which provider.
        provider: String,
        /// The answer's `Content-Type`.
        content_type: String,
    },
    /// The model step, every attempt and wait included, ran past its
    /// deadline (`step_timeout_secs`); a stream of keep-alives alone ends here.
    #[error("{provider}: the model step ran past its deadline of {} s", .after.as_secs_f64())]
    Deadline {
        /// Which provider.
        provider: String,
        /// The deadline.
        after: Duration,
    },
    /// The last failure of a request that was tried several times.
    #[error("{last} (gave up after {attempts} attempts)")]
    GaveUp {
        /// How many requests were made.
        attempts: u32,
        /// The last one's failure.
        last: Box<ProviderError>,
    },
    /// The request was refused before it was sent (for example a history
    /// that cannot fit the model's context window).
    #[error("{provider}: {message}")]
    Request {
        /// Which provider.
        provider: String,
        /// Why.
        message: String,
    },
}

impl ProviderError {
    /// Whether trying again may help: rate limits, server errors, broken
    /// connections and stalls, and errors the provider marked as passing.
    pub fn is_retryable(&self) -> bool {
        match self {
            ProviderError::Status { status, .. } => {
                *status == 408 || *status == 409 || *status == 429 || *status >= 500
            }
            ProviderError::Stream { retryable, .. } => *retryable,
            ProviderError::Connection { .. } | ProviderError::Stalled { .. } | ProviderError::Truncated { .. } => true,
            ProviderError::Malformed { .. }
            | ProviderError::TooLarge { .. }
            | ProviderError::Request { .. }
            | ProviderError::NotEventStream { .. }
            | ProviderError::Deadline { .. }
            | ProviderError::GaveUp { .. } => false,
        }
    }

    /// Whether the provider refused the request as too long for the
    /// model's context (or Keel's own estimate did, before sending it). The
    /// runtime then compacts the history once and tries again.
    pub fn is_context_length_exceeded(&self) -> bool {
        match self.cause() {
            ProviderError::Status { status, message, .. } => {
                matches!(status, 400 | 413 | 422) && mentions_context_length(message)
            }
            ProviderError::Stream { message, .. } | ProviderError::Request { message, .. } => {
                mentions_context_length(message)
            }
            _ => false,
        }
    }

    /// The failure itself, without the count of attempts around it.
    pub fn cause(&self) -> &ProviderError {
        match self {
            ProviderError::GaveUp { last, .. } => last.cause(),
            other => other,
        }
    }

    /// The wait the provider asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.cause() {
            ProviderError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// Whether a provider's error message says the request is too long for the
/// model's context. The documented forms: OpenAI's code
/// `context_length_exceeded` ("This model's maximum context length is …",
/// Responses: "Your input exceeds the context window of this model"),
/// Anthropic's `invalid_request_error` "prompt is too long: N tokens > M
/// maximum", llama.cpp's `exceed_context_size_error`, and Keel's own refusal
/// in `keel_providers::ProviderSettings::check_context`.
pub fn mentions_context_length(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    [
        "context_length_exceeded",
        "maximum context length",
        "exceeds the context window",
        "prompt is too long",
        "exceed_context_size",
        "exceeds the available context size",
        "does not fit the model's context window",
    ]
    .iter()
    .any(|needle| message.contains(needle))
}

#[cfg(test)]
mod context_tests {
    use super::*;

    #[test]
    fn context_length_errors_are_recognized_in_each_providers_words() {
        let status = |status, message: &str| ProviderError::Status {
            provider: "p".into(),
            status,
            message: message.into(),
            retry_after: None,
        };
        for message in [
            "invalid_request_error: This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.",
            "invalid_request_error: Your input exceeds the context window of this model. Please adjust your input and try again.",
            "invalid_request_error: prompt is too long: 210000 tokens > 200000 maximum",
            "exceed_context_size_error: the request exceeds the available context size",
        ] {
            assert!(status(400, message).is_context_length_exceeded(), "{message}");
        }
        assert!(!status(400, "invalid_request_error: bad tool schema").is_context_length_exceeded());
        assert!(!status(500, "maximum context length").is_context_length_exceeded());
        let gave_up = ProviderError::GaveUp {
            attempts: 2,
            last: Box::new(ProviderError::Stream {
                provider: "p".into(),
                message: "context_length_exceeded: too long".into(),
                retryable: false,
            }),
        };
        assert!(gave_up.is_context_length_exceeded());
    }
}
