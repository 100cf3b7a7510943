//! The page, its script and style, and the vendored uPlot, embedded in the binary: the
//! dashboard needs no network and no files beside the runs.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

/// `(path, content type, bytes)` of every embedded file; nothing else is served.
const ASSETS: [(&str, &str, &[u8]); 6] = [
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("../assets/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../assets/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("../assets/app.css"),
    ),
    (
        "vendor/uplot/uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../assets/vendor/uplot/uPlot.iife.min.js"),
    ),
    (
        "vendor/uplot/uPlot.min.css",
        "text/css; charset=utf-8",
        include_bytes!("../assets/vendor/uplot/uPlot.min.css"),
    ),
    (
        "vendor/uplot/LICENSE",
        "text/plain; charset=utf-8",
        include_bytes!("../assets/vendor/uplot/LICENSE"),
    ),
];

/// The page's content security policy: its own scripts only, no inline script, no frames, no
/// plugins — defence in depth for a page that shows model-generated text (which it already
/// inserts as text, never as HTML).
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'";

/// The embedded file at `path`, or 404. Paths are matched exactly against the embedded list,
/// so no request reaches the file system through here.
pub(crate) fn asset(path: &str) -> Response {
    match ASSETS.iter().find(|(p, _, _)| *p == path) {
        Some((_, kind, bytes)) => (
            [
                (header::CONTENT_TYPE, *kind),
                (header::CACHE_CONTROL, "no-cache"),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            ],
            *bytes,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "not found").into_response(),
    }
}
