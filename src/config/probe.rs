//! The local Ollama probe used by provider auto-detection: one cheap GET with a short timeout.

use std::time::Duration;

use crate::provider::install_crypto_provider;

/// How long the whole probe may take.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_millis(1500);

/// Whether an Ollama (or any OpenAI-compatible server) answers at `root`, the server's URL
/// without `/v1`: `GET {root}/api/tags` (Ollama's own API), else `GET {root}/v1/models`. No
/// proxy is used, and the whole probe ends after [`PROBE_TIMEOUT`].
pub(crate) async fn ollama_answers(root: &str) -> bool {
    install_crypto_provider();
    let Ok(client) = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(PROBE_TIMEOUT)
        .timeout(PROBE_TIMEOUT)
        .build()
    else {
        return false;
    };
    let root = root.trim_end_matches('/');
    let probe = async {
        for path in ["/api/tags", "/v1/models"] {
            match client.get(format!("{root}{path}")).send().await {
                Ok(response) if response.status().is_success() => return true,
                // Something answers, but not there: try the other path.
                Ok(_) => {}
                // Nothing listens (or it hangs): no point trying another path.
                Err(_) => return false,
            }
        }
        false
    };
    tokio::time::timeout(PROBE_TIMEOUT, probe)
        .await
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::Instant;
    use summon_mock_llm::{MockConfig, MockServer};

    /// Serves one request with `status` on 127.0.0.1 and returns its root URL and the path
    /// that was asked for.
    fn one_shot_server(status: &'static str) -> (String, std::thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let root = format!("http://{}", listener.local_addr().expect("addr"));
        let handle = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().expect("accept");
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut buf).expect("read");
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
            }
            let body = r#"{"models":[]}"#;
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let request = String::from_utf8_lossy(&request).into_owned();
            request
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_owned()
        });
        (root, handle)
    }

    #[tokio::test]
    async fn answers_from_ollama_tags() {
        let (root, server) = one_shot_server("200 OK");
        assert!(ollama_answers(&root).await);
        assert_eq!(server.join().expect("server"), "/api/tags");
    }

    #[tokio::test]
    async fn falls_back_to_the_models_list() {
        // The mock serves GET /v1/models and answers 404 elsewhere.
        let server = MockServer::start(MockConfig::new()).await;
        assert!(ollama_answers(&server.url_anthropic()).await);
    }

    #[tokio::test]
    async fn a_dead_port_answers_no_quickly() {
        let port = {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.local_addr().expect("addr").port()
        };
        let start = Instant::now();
        assert!(!ollama_answers(&format!("http://127.0.0.1:{port}")).await);
        assert!(start.elapsed() <= PROBE_TIMEOUT + Duration::from_millis(500));
    }

    #[tokio::test]
    async fn a_server_that_never_answers_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let root = format!("http://{}", listener.local_addr().expect("addr"));
        let start = Instant::now();
        assert!(!ollama_answers(&root).await);
        let elapsed = start.elapsed();
        assert!(
            elapsed >= PROBE_TIMEOUT - Duration::from_millis(100),
            "{elapsed:?}"
        );
        assert!(
            elapsed <= PROBE_TIMEOUT + Duration::from_millis(1000),
            "{elapsed:?}"
        );
        drop(listener);
    }
}
