//! The live page: plain HTML, CSS and one JavaScript module, embedded in the binary (so a
//! server installed alone serves it), over the same API every client uses.
//!
//! The page signs in with an API key, kept in the tab's `sessionStorage` and shown only in
//! headers (`Authorization`, or a WebSocket's subprotocol: [`crate::WS_KEY_PREFIX`]),
//! never in a URL. It follows the key's boxes over `GET /v1/events` and a box over
//! `GET /v1/boxes/{id}/events` ([`crate::events`]), a process's output over its stream's
//! WebSocket from a byte cursor, and a terminal over `/v1/boxes/{id}/terminal` (xterm.js,
//! installed from npm by `scripts/page-assets`, embedded by the build script).
//!
//! Every answer carries a Content-Security-Policy that lets the page reach this server alone:
//! no script, style, image or connection from anywhere else, and no frame around it.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// The policy of every answer of the page: this server, and nothing else.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
img-src 'self' data:; font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
frame-ancestors 'none'";

/// The files of the page: path under `/page/`, type, bytes.
const FILES: [(&str, &str, &[u8]); 6] = [
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("../page/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../page/app.js"),
    ),
    ("app.css", "text/css; charset=utf-8", include_bytes!("../page/app.css")),
    (
        "xterm.mjs",
        "text/javascript; charset=utf-8",
        include_bytes!(concat!(env!("OUT_DIR"), "/xterm.mjs")),
    ),
    (
        "xterm.css",
        "text/css; charset=utf-8",
        include_bytes!(concat!(env!("OUT_DIR"), "/xterm.css")),
    ),
    (
        "addon-fit.mjs",
        "text/javascript; charset=utf-8",
        include_bytes!(concat!(env!("OUT_DIR"), "/addon-fit.mjs")),
    ),
];

/// Whether this binary was built with xterm.js (see the build script).
pub const HAS_TERMINAL: bool = !env!("AGENTBOX_PAGE_TERMINAL").is_empty();

/// The page's routes: `/` (the page) and `/page/<file>`.
pub(crate) fn routes() -> axum::Router {
    let mut r = axum::Router::new().route("/", get(|| async { file("index.html") }));
    for (name, _, _) in FILES {
        r = r.route(&format!("/page/{name}"), get(move || async move { file(name) }));
    }
    r
}

fn file(name: &str) -> Response {
    let Some((_, kind, bytes)) = FILES.iter().find(|(n, _, _)| *n == name) else {
        return axum::http::StatusCode::NOT_FOUND.into_response();
    };
    let mut r = (*bytes).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // The page is as new as the binary: asked again each load, so an upgrade shows at once.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    #[tokio::test]
    async fn every_file_is_served_under_a_policy_of_this_server_alone() {
        for (path, kind) in [
            ("/", "text/html"),
            ("/page/app.js", "text/javascript"),
            ("/page/app.css", "text/css"),
            ("/page/xterm.mjs", "text/javascript"),
        ] {
            let r = super::routes()
                .oneshot(Request::get(path).body(Body::empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{path}");
            let h = r.headers();
            assert!(h["content-type"].to_str().unwrap().starts_with(kind), "{path}");
            let csp = h["content-security-policy"].to_str().unwrap();
            assert!(
                csp.contains("connect-src 'self'") && csp.contains("default-src 'none'"),
                "{csp}"
            );
        }
    }
}
