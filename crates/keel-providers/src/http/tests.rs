use super::*;

/// The events of a stream over `chunks` until it ends or fails.
fn read_all(chunks: &[&[u8]], max_bytes: usize) -> (Vec<String>, Option<ProviderError>) {
    let settings = HttpSettings {
        max_response_bytes: max_bytes,
        ..HttpSettings::default()
    };
    let chunks = chunks
        .iter()
        .map(|chunk| bytes::Bytes::copy_from_slice(chunk))
        .collect();
    let mut stream = EventStream::from_chunks("p", &settings, chunks, None);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut data = Vec::new();
        loop {
            match stream.next().await {
                Ok(Some(event)) => data.push(event.data),
                Ok(None) => return (data, None),
                Err(error) => {
                    // A failed stream stays failed.
                    assert_eq!(stream.next().await.err().as_ref(), Some(&error));
                    return (data, Some(error));
                }
            }
        }
    })
}

#[test]
fn events_before_a_failure_are_read_however_the_bytes_arrived() {
    let body: &[u8] = b"data: one\n\ndata: two\n\n\xff\ndata: three\n\n";
    let whole = read_all(&[body], 1 << 20);
    assert_eq!(whole.0, ["one", "two"]);
    assert!(matches!(whole.1, Some(ProviderError::Malformed { .. })), "{whole:?}");
    let (first, rest) = body.split_at(7);
    assert_eq!(read_all(&[first, rest], 1 << 20), whole);
    // Past the size limit: what came before it is read, then the error.
    let limited = read_all(&[body], 22);
    assert_eq!(limited.0, ["one", "two"]);
    assert!(
        matches!(limited.1, Some(ProviderError::TooLarge { limit: 22, .. })),
        "{limited:?}"
    );
    assert_eq!(read_all(&[&body[..10], &body[10..]], 22), limited);
}

#[test]
fn error_messages_come_from_the_providers_bodies() {
    let status = reqwest::StatusCode::UNAUTHORIZED;
    let openai = br#"{"error": {"message": "Incorrect API key provided: sk-...", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}"#;
    assert_eq!(
        error_message(openai, status),
        "invalid_request_error: Incorrect API key provided: sk-..."
    );
    let anthropic = br#"{"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}"#;
    assert_eq!(
        error_message(anthropic, status),
        "authentication_error: invalid x-api-key"
    );
    assert_eq!(
        error_message(br#"{"error": "model not found"}"#, status),
        "model not found"
    );
    assert_eq!(
        error_message(b"<html>bad gateway</html>", status),
        "<html>bad gateway</html>"
    );
    assert_eq!(error_message(b"", status), "Unauthorized");
}

#[test]
fn retry_after_accepts_seconds_milliseconds_and_dates() {
    let mut headers = HeaderMap::new();
    headers.insert("retry-after", HeaderValue::from_static("3"));
    assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
    headers.insert("retry-after-ms", HeaderValue::from_static("250"));
    assert_eq!(retry_after(&headers), Some(Duration::from_millis(250)));
    let mut dated = HeaderMap::new();
    dated.insert("retry-after", HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"));
    assert_eq!(
        retry_after(&dated),
        Some(Duration::ZERO),
        "a date in the past means now"
    );
    let mut garbage = HeaderMap::new();
    garbage.insert("retry-after", HeaderValue::from_static("soon"));
    assert_eq!(retry_after(&garbage), None);
}

#[test]
fn backoff_grows_within_its_bounds_and_retry_after_wins() {
    let policy = RetryPolicy::default();
    for retry in 0..10 {
        let wait = policy.delay(retry, None);
        assert!(wait <= policy.max_backoff, "{wait:?}");
    }
    assert_eq!(policy.delay(0, Some(Duration::from_secs(7))), Duration::from_secs(7));
    assert_eq!(
        policy.delay(0, Some(Duration::from_secs(7_000))),
        policy.max_retry_after
    );
}

#[test]
fn secrets_do_not_show_in_debug_output() {
    assert_eq!(format!("{:?}", Secret::new("sk-live-123")), "Secret(***)");
}
