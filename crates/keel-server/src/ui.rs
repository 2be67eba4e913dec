//! The web UI: static files embedded in the binary, served without a token
//! (the page asks for an API key, a JWT or the token and sends it with its
//! API calls).
//!
//! The page's modules each have one job: `app` (routing, wiring), `chat`
//! (the conversation; `tool_card` its tool calls, `client_tool` the result
//! form of a client tool's call), `follow` (sticking to
//! the bottom unless the reader scrolled up), `inherited` (a fork's
//! inherited items), `drafts`, `panels`, `shortcuts`, `sidebar`,
//! `new_chat`, `feed` (the event stream), `timeline`, `markdown`, `dom`
//! (element helpers), `api` (requests with the credential, kept in
//! sessionStorage), `signin` (the sign-in box) and `principal` (who the
//! page is, from `GET /v1/whoami`; what its scopes forbid is hidden
//! through `data-needs` marks). highlight.js runs on sanitized code
//! blocks' text and its output is sanitized again.

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
    ("/assets/dom.js", JS, include_str!("ui/dom.js")),
    ("/assets/drafts.js", JS, include_str!("ui/drafts.js")),
    ("/assets/follow.js", JS, include_str!("ui/follow.js")),
    ("/assets/inherited.js", JS, include_str!("ui/inherited.js")),
    ("/assets/panels.js", JS, include_str!("ui/panels.js")),
    ("/assets/shortcuts.js", JS, include_str!("ui/shortcuts.js")),
    ("/assets/timeline.js", JS, include_str!("ui/timeline.js")),
    ("/assets/markdown.js", JS, include_str!("ui/markdown.js")),
    (
        "/assets/vendor/marked.esm.js",
        JS,
        include_str!("ui/vendor/marked.esm.js"),
    ),
    (
        "/assets/vendor/purify.es.mjs",
        JS,
        include_str!("ui/vendor/purify.es.mjs"),
    ),
    (
        "/assets/vendor/highlight.min.js",
        JS,
        include_str!("ui/vendor/highlight.min.js"),
    ),
    (
        "/assets/vendor/highlight-github.min.css",
        CSS,
        include_str!("ui/vendor/highlight-github.min.css"),
    ),
    (
        "/assets/vendor/highlight-github-dark.min.css",
        CSS,
        include_str!("ui/vendor/highlight-github-dark.min.css"),
    ),
    ("/assets/app.css", CSS, include_str!("ui/app.css")),
    ("/assets/sidebar.css", CSS, include_str!("ui/sidebar.css")),
    ("/assets/sidebar.js", JS, include_str!("ui/sidebar.js")),
    ("/assets/new_chat.js", JS, include_str!("ui/new_chat.js")),
    ("/assets/principal.js", JS, include_str!("ui/principal.js")),
    ("/assets/signin.js", JS, include_str!("ui/signin.js")),
    ("/assets/tool_card.js", JS, include_str!("ui/tool_card.js")),
    ("/assets/client_tool.js", JS, include_str!("ui/client_tool.js")),
    ("/assets/principal.css", CSS, include_str!("ui/principal.css")),
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

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    /// The vendored libraries are the published files (see
    /// `ui/vendor/VENDOR.md`), byte for byte.
    #[test]
    fn vendored_files_match_their_published_checksums() {
        for (body, expected) in [
            (
                include_str!("ui/vendor/marked.esm.js"),
                "5371fea86fd0656b4fc7bea7c94c663109d82789b69433eeee78d42895aa44de",
            ),
            (
                include_str!("ui/vendor/purify.es.mjs"),
                "5e8c53cd086a012531fc754ee6a7ad7a02e8a06fc4dadd805b912e128c3f6c58",
            ),
            (
                include_str!("ui/vendor/highlight.min.js"),
                "7865839949f0764d9e0a21e311a4e2c42633eeaee8ca5ec127b86438565731fe",
            ),
            (
                include_str!("ui/vendor/highlight-github.min.css"),
                "3a9a5def8b9c311e5ae43abde85c63133185eed4f0d9f67fea4b00a8308cf066",
            ),
            (
                include_str!("ui/vendor/highlight-github-dark.min.css"),
                "9f208d022102b1d0c7aebfecd8e42ca7997d5de636649d2b31ea63093d809019",
            ),
        ] {
            let digest = Sha256::digest(body.as_bytes());
            let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
            assert_eq!(hex, expected);
        }
    }
}
