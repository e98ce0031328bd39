//! TLS for a network: HTTP/2 and HTTP/1.1 over rustls with a certificate from PEM files, a
//! client that never finishes its handshake holding up no one, plain HTTP to the TLS port
//! refused, and files that are not a certificate named in the error.

use std::sync::Arc;
use std::time::Duration;

use agentbox_server::{Keys, ServerOptions};

struct Pem {
    _dir: tempfile::TempDir,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    ca: reqwest::Certificate,
}

fn pem() -> Pem {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
    let ca = reqwest::Certificate::from_pem(made.cert.pem().as_bytes()).unwrap();
    Pem {
        _dir: dir,
        cert,
        key,
        ca,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_speaks_tls_with_http2_and_a_silent_client_holds_up_no_one() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let p = pem();
    let config = agentbox_server::tls::config(&p.cert, &p.key).unwrap();
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let app = agentbox_server::router(ServerOptions::new(Arc::new(Keys::in_memory().unwrap())));
    tokio::spawn(agentbox_server::serve(
        agentbox_server::tls::TlsListener::new(tcp, config),
        app,
        std::future::pending(),
    ));
    // A client that connects and never says a word.
    let _silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(p.ca.clone())
        .resolve("localhost", addr)
        .timeout(Duration::from_secs(30))
        .no_proxy()
        .build()
        .unwrap();
    let r = client
        .get(format!("https://localhost:{}/healthz", addr.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.version(), reqwest::Version::HTTP_2, "ALPN chose HTTP/2");
    let one = reqwest::Client::builder()
        .add_root_certificate(p.ca)
        .resolve("localhost", addr)
        .http1_only()
        .no_proxy()
        .build()
        .unwrap();
    let r = one
        .get(format!("https://localhost:{}/v1/boxes", addr.port()))
        .send()
        .await
        .unwrap();
    assert_eq!((r.status().as_u16(), r.version()), (401, reqwest::Version::HTTP_11));
    // Plain HTTP to the TLS port gets no answer.
    let plain = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    assert!(plain.get(format!("http://{addr}/healthz")).send().await.is_err());
}

#[test]
fn files_that_are_not_a_certificate_and_key_are_named() {
    let p = pem();
    let e = agentbox_server::tls::config(&p.key, &p.key).unwrap_err();
    assert!(e.message().starts_with("--tls-cert"), "{e}");
    let e = agentbox_server::tls::config(&p.cert, &p.cert).unwrap_err();
    assert!(e.message().starts_with("--tls-key"), "{e}");
    let e = agentbox_server::tls::config(&p.cert.with_extension("nope"), &p.key).unwrap_err();
    assert!(e.message().starts_with("--tls-cert"), "{e}");
    let other = pem();
    let e = agentbox_server::tls::config(&p.cert, &other.key).unwrap_err();
    assert!(e.message().starts_with("--tls-cert and --tls-key"), "{e}");
}
