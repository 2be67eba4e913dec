//! The web UI: static files embedded in the binary, served without a token
//! (the page asks for one and sends it with its API calls).

use axum::Router;
use axum::http::header;
use axum::routing::get;

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const SVG: &str = "image/svg+xml";

/// The page loads nothing from anywhere else.
const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'";

/// Each file: its path, content type and content.
const FILES: &[(&str, &str, &str)] = &[
    ("/", HTML, include_str!("ui/index.html")),
    ("/assets/app.js", JS, include_str!("ui/app.js")),
    ("/assets/api.js", JS, include_str!("ui/api.js")),
    ("/assets/feed.js", JS, include_str!("ui/feed.js")),
    ("/assets/chat.js", JS, include_str!("ui/chat.js")),
    ("/assets/app.css", CSS, include_str!("ui/app.css")),
    ("/assets/icon.svg", SVG, include_str!("ui/icon.svg")),
];

/// `/` and the files under `/assets/`.
pub(crate) fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    FILES.iter().fold(Router::new(), |router, &(path, content_type, body)| {
        router.route(
            path,
            get(move || async move {
                (
                    [
                        (header::CONTENT_TYPE, content_type),
                        // A new binary may bring new files: always revalidate.
                        (header::CACHE_CONTROL, "no-cache"),
                        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
                    ],
                    body,
                )
            }),
        )
    })
}
