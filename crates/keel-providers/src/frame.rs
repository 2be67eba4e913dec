//! The frame every wire format plugs into: [`HttpModel`] does what all model
//! APIs over HTTP share (the context check, the request, retries within the
//! step deadline, a complete JSON answer replayed as events, the read loop
//! and its failures, streaming to the sink), and a [`WireFormat`] says what
//! one API's requests look like and how its events decode.
//!
//! A provider is a `WireFormat` (its request body, headers, path and a
//! [`StreamDecoder`] for one response) plus an arm of
//! [`crate::ProviderKind`]; nothing here knows any one API.

use std::sync::Arc;

use serde_json::Value;

use crate::http::{AttemptError, EventStream, HttpClient, Secret, with_retries, within_step_deadline};
use crate::sse::SseEvent;
use crate::{ProviderError, ProviderSettings};
use keel_model::{BoxFuture, Model, ModelEvent, ModelEventSink, ModelOutput, ModelRequest};

/// One model API's dialect: where requests go, what they carry, and how the
/// events of its response decode.
pub trait WireFormat: Send + Sync + 'static {
    /// The state of one response being decoded.
    type Decoder: StreamDecoder;

    /// The path after the base URL that requests are posted to
    /// (`/chat/completions`).
    const PATH: &'static str;

    /// The provider as OpenTelemetry's GenAI conventions name it
    /// (`gen_ai.provider.name`): the API's maker, whatever server speaks it.
    const PROVIDER: &'static str;

    /// The request headers: authentication, then the configured headers
    /// (which come last, so that they may replace any of the others).
    fn headers(&self, settings: &ProviderSettings) -> Vec<(String, Secret)>;

    /// The JSON body for `request`. Built again for every attempt, so a
    /// format may change what it asks for between them (see
    /// [`WireFormat::adapt_to_refusal`]).
    fn body(&self, settings: &ProviderSettings, request: &ModelRequest<'_>) -> Value;

    /// The events a stream would have carried for `answer`, a complete JSON
    /// answer that a server sent in place of a stream.
    fn events_of_complete(&self, answer: Value) -> Vec<SseEvent>;

    /// A decoder for one response.
    fn decoder(&self, settings: &ProviderSettings) -> Self::Decoder;

    /// Whether a request the endpoint refused with `error` should be sent
    /// again at once, with a body built anew (the format having learnt what
    /// the endpoint does not accept). By default a refusal is final for the
    /// attempt.
    fn adapt_to_refusal(&self, settings: &ProviderSettings, error: &ProviderError) -> bool {
        let _ = (settings, error);
        false
    }

    /// The output limit [`WireFormat::body`] sends: the configured one, by
    /// default; a format whose API requires one sends its own default.
    fn max_tokens(&self, settings: &ProviderSettings) -> Option<u32> {
        settings.max_output_tokens
    }
}

/// Whether a response goes on after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded {
    /// More events are to come.
    More,
    /// The terminal event came: the response is complete.
    Done,
}

/// The decoding of one response's events, fed one at a time.
pub trait StreamDecoder: Send {
    /// Decodes one event, streaming what it carries through `emitter`.
    fn event(&mut self, event: &SseEvent, emitter: &mut Emitter) -> Result<Decoded, ReadError>;

    /// The assembled output, once the terminal event came.
    fn finish(self) -> Result<ModelOutput, ReadError>;

    /// What a failure to read the body means for this format; by default
    /// the failure itself.
    fn read_failed(&self, error: ProviderError) -> ProviderError {
        error
    }
}

/// A model behind an HTTP API that speaks the wire format `W`.
#[derive(Debug)]
pub struct HttpModel<W> {
    settings: ProviderSettings,
    http: HttpClient,
    wire: W,
}

impl<W: WireFormat + Default> HttpModel<W> {
    /// A client for the model and endpoint in `settings`.
    pub fn new(settings: ProviderSettings) -> keel_protocol::Result<Self> {
        Self::with_wire(settings, W::default())
    }
}

impl<W: WireFormat> HttpModel<W> {
    /// A client for the model and endpoint in `settings` that speaks `wire`.
    pub fn with_wire(settings: ProviderSettings, wire: W) -> keel_protocol::Result<Self> {
        let http = HttpClient::new(settings.name.clone(), settings.http.clone())?;
        Ok(Self { settings, http, wire })
    }

    /// The settings in use.
    pub fn settings(&self) -> &ProviderSettings {
        &self.settings
    }

    /// The JSON body for `request`.
    pub(crate) fn body(&self, request: &ModelRequest<'_>) -> Value {
        self.wire.body(&self.settings, request)
    }

    /// Sends the request and opens its event stream; a refusal the format
    /// adapts to is answered by sending the request again at once.
    async fn open(
        &self,
        url: &str,
        headers: &[(String, Secret)],
        request: &ModelRequest<'_>,
    ) -> Result<EventStream, ProviderError> {
        match self.http.post_events(url, headers, &self.body(request)).await {
            Err(error) if self.wire.adapt_to_refusal(&self.settings, &error) => {
                self.http.post_events(url, headers, &self.body(request)).await
            }
            result => result,
        }
    }

    /// One try: send, then read the stream to its terminal event. A failure
    /// says whether anything was streamed (then it is not retried).
    async fn attempt(
        &self,
        url: &str,
        headers: &[(String, Secret)],
        request: &ModelRequest<'_>,
        sink: ModelEventSink,
    ) -> Result<ModelOutput, AttemptError> {
        let stream = self
            .open(url, headers, request)
            .await
            .map_err(|error| AttemptError::Provider { error, streamed: false })?;
        let mut emitter = Emitter::new(sink);
        self.read(stream, &mut emitter)
            .await
            .map_err(|error| error.into_attempt(&emitter))
    }

    /// Reads `stream` up to its terminal event, forwarding output through
    /// `emitter`, and returns the assembled output. A body that ends
    /// cleanly before the terminal event lost the rest: truncated.
    pub async fn read(&self, mut stream: EventStream, emitter: &mut Emitter) -> Result<ModelOutput, ReadError> {
        if let Some(answer) = stream.take_complete() {
            stream.replay(self.wire.events_of_complete(answer));
        }
        let mut decoder = self.wire.decoder(&self.settings);
        loop {
            let event = match stream.next().await {
                Ok(Some(event)) => event,
                Ok(None) => return Err(truncated(&self.settings.name).into()),
                Err(error) => return Err(decoder.read_failed(error).into()),
            };
            if decoder.event(&event, emitter)? == Decoded::Done {
                return decoder.finish();
            }
        }
    }
}

impl<W: WireFormat> Model for HttpModel<W> {
    fn respond<'a>(
        &'a self,
        request: ModelRequest<'a>,
        events: ModelEventSink,
    ) -> BoxFuture<'a, keel_protocol::Result<ModelOutput>> {
        Box::pin(async move {
            self.settings.check_context(request.instructions, request.history)?;
            let url = format!("{}{}", self.settings.base_url, W::PATH);
            let headers = self.wire.headers(&self.settings);
            // When each retry started, for the step's span.
            let retries = std::sync::Mutex::new(Vec::new());
            let attempts = with_retries(&self.settings.http.retry, |retry| {
                if retry > 0 {
                    retries
                        .lock()
                        .unwrap_or_else(|poison| poison.into_inner())
                        .push(keel_protocol::now_ms());
                }
                self.attempt(&url, &headers, &request, Arc::clone(&events))
            });
            let mut output = within_step_deadline(&self.settings.name, &self.settings.http, attempts).await?;
            output.retries = retries.into_inner().unwrap_or_else(|poison| poison.into_inner());
            output.server_address = reqwest::Url::parse(&self.settings.base_url)
                .ok()
                .and_then(|url| url.host_str().map(str::to_owned));
            Ok(output)
        })
    }

    fn name(&self) -> String {
        self.settings.display_name()
    }

    fn context_limits(&self) -> Option<keel_model::ContextLimits> {
        self.settings.context_limits()
    }

    fn provider_name(&self) -> Option<&'static str> {
        Some(W::PROVIDER)
    }

    fn request_parameters(&self) -> keel_model::RequestParameters {
        keel_model::RequestParameters {
            max_tokens: self.wire.max_tokens(&self.settings),
            temperature: self.settings.temperature,
        }
    }
}

/// The key as a bearer token, then the configured headers (which may
/// replace it, for gateways that authenticate differently): OpenAI's way.
pub(crate) fn bearer_headers(settings: &ProviderSettings) -> Vec<(String, Secret)> {
    let mut headers = Vec::with_capacity(settings.headers.len() + 1);
    if let Some(key) = &settings.api_key {
        headers.push((
            "authorization".to_owned(),
            Secret::new(format!("Bearer {}", key.expose())),
        ));
    }
    headers.extend(settings.headers.iter().cloned());
    headers
}

/// Sets `kept` to `seen` if it has no value yet and `seen` is not empty:
/// a response's id and model are taken from the first event naming them.
pub(crate) fn keep_first(kept: &mut Option<String>, seen: Option<String>) {
    if kept.is_none() {
        *kept = seen.filter(|value| !value.is_empty());
    }
}

/// The response stopped before its terminal event.
pub(crate) fn truncated(provider: &str) -> ProviderError {
    ProviderError::Truncated {
        provider: provider.to_owned(),
    }
}

/// The response is not what the API's protocol says it is.
pub(crate) fn malformed(provider: &str, message: String) -> ReadError {
    ReadError::Provider(ProviderError::Malformed {
        provider: provider.to_owned(),
        message,
    })
}

/// Why reading a response stream stopped early.
#[derive(Debug)]
pub enum ReadError {
    /// The provider failed (retryable or not, as the error says).
    Provider(ProviderError),
    /// Something no retry can fix, such as a closed sink: the step is over.
    Fatal(keel_protocol::Error),
}

impl From<ProviderError> for ReadError {
    fn from(error: ProviderError) -> Self {
        ReadError::Provider(error)
    }
}

impl From<keel_protocol::Error> for ReadError {
    fn from(error: keel_protocol::Error) -> Self {
        ReadError::Fatal(error)
    }
}

impl ReadError {
    /// The attempt's failure, given what `emitter` already streamed: a
    /// provider failure after streamed output is never retried.
    fn into_attempt(self, emitter: &Emitter) -> AttemptError {
        match self {
            ReadError::Provider(error) => AttemptError::Provider {
                error,
                streamed: emitter.emitted(),
            },
            ReadError::Fatal(error) => AttemptError::Fatal(error),
        }
    }
}

/// Forwards streamed output to the sink and remembers whether any reached
/// it, which decides whether a failed request may be retried.
pub struct Emitter {
    sink: ModelEventSink,
    emitted: bool,
}

impl Emitter {
    /// An emitter into `sink` that has sent nothing yet.
    pub fn new(sink: ModelEventSink) -> Self {
        Self { sink, emitted: false }
    }

    /// Streams text to the sink.
    pub fn text(&mut self, text: &str) -> keel_protocol::Result<()> {
        self.send(ModelEvent::TextDelta(text.to_owned()), text)
    }

    /// Streams reasoning text to the sink.
    pub fn reasoning(&mut self, text: &str) -> keel_protocol::Result<()> {
        self.send(ModelEvent::ReasoningDelta(text.to_owned()), text)
    }

    fn send(&mut self, event: ModelEvent, text: &str) -> keel_protocol::Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        self.emitted = true;
        (self.sink)(event)
    }

    /// Whether anything reached the sink.
    pub fn emitted(&self) -> bool {
        self.emitted
    }
}
