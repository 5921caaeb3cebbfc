//! The context window an OpenAI-compatible server says it serves a model with, asked once
//! when the config file gives none: llama.cpp's `GET /props` (`default_generation_settings.
//! n_ctx`, the window of one slot: with `--parallel 2` half of `--ctx-size`), vLLM's
//! `GET /v1/models` (`max_model_len` of the model's entry), Ollama's `POST /api/show`
//! (its `num_ctx` parameter when the model sets one, else `model_info.<arch>.context_length`).
//! Each ask has a short timeout; a server that says none of these gives `None`.

use std::time::Duration;

use serde_json::{Value, json};

use super::client::{ProviderEndpoint, ProviderKind};

/// How long each of the asks may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// A window a server said, and where it said it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerWindow {
    pub(crate) tokens: u64,
    /// The request that said it (`GET http://127.0.0.1:8080/props`).
    pub(crate) from: String,
}

/// The server's root URL: the base URL without its `/v1`.
fn root(base_url: &str) -> &str {
    let base = base_url.trim_end_matches('/');
    base.strip_suffix("/v1").unwrap_or(base)
}

/// `GET URL` of a server's `/props` (llama.cpp's server properties), asked at most once per
/// URL in a process: the context-window lookup and the check of the chat template's tool
/// support share the answer. `None` for anything but a 2xx JSON answer.
pub(crate) async fn props(request: reqwest::RequestBuilder, url: &str) -> Option<Value> {
    type Cache = tokio::sync::Mutex<std::collections::HashMap<String, Option<Value>>>;
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    let mut cache = CACHE.get_or_init(Cache::default).lock().await;
    if let Some(known) = cache.get(url) {
        return known.clone();
    }
    let answer = async {
        let response = request.send().await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.json::<Value>().await.ok()
    }
    .await;
    cache.insert(url.to_owned(), answer.clone());
    answer
}

/// The window `endpoint`'s server says it serves `model` with, if it says one (only an
/// OpenAI-compatible server is asked).
pub(crate) async fn server_window(
    endpoint: &ProviderEndpoint,
    model: &str,
) -> Option<ServerWindow> {
    if endpoint.kind != ProviderKind::OpenAi {
        return None;
    }
    super::install_crypto_provider();
    let client = reqwest::Client::builder()
        .no_proxy()
        .user_agent(concat!("summon/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(ASK_TIMEOUT)
        .timeout(ASK_TIMEOUT)
        .build()
        .ok()?;
    let auth = |request: reqwest::RequestBuilder| match &endpoint.api_key {
        Some(key) => request.bearer_auth(key.expose()),
        None => request,
    };
    let get = |url: String| {
        let request = auth(client.get(&url));
        async move {
            let response = request.send().await.ok()?;
            if !response.status().is_success() {
                return None;
            }
            response.json::<Value>().await.ok().map(|v| (url, v))
        }
    };
    let root = root(&endpoint.base_url);
    let props_url = format!("{root}/props");
    if let Some(props) = props(auth(client.get(&props_url)), &props_url).await
        && let Some(tokens) = llama_props(&props)
    {
        let url = props_url;
        return Some(ServerWindow {
            tokens,
            from: format!("GET {url}"),
        });
    }
    let base = endpoint.base_url.trim_end_matches('/');
    if let Some((url, models)) = get(format!("{base}/models")).await
        && let Some(tokens) = vllm_models(&models, model)
    {
        return Some(ServerWindow {
            tokens,
            from: format!("GET {url}"),
        });
    }
    let url = format!("{root}/api/show");
    let response = auth(client.post(&url).json(&json!({"model": model})))
        .send()
        .await
        .ok()
        .filter(|r| r.status().is_success())?;
    let show: Value = response.json().await.ok()?;
    ollama_show(&show).map(|tokens| ServerWindow {
        tokens,
        from: format!("POST {url}"),
    })
}

fn positive(value: &Value) -> Option<u64> {
    value.as_u64().filter(|n| *n > 0)
}

/// llama.cpp's `/props`: the window of one slot.
fn llama_props(props: &Value) -> Option<u64> {
    positive(&props["default_generation_settings"]["n_ctx"])
}

/// vLLM's `/v1/models`: the `max_model_len` of the entry whose id is `model` (or of the only
/// entry, which a server with one model answers under any name).
fn vllm_models(models: &Value, model: &str) -> Option<u64> {
    let data = models["data"].as_array()?;
    let entry = data
        .iter()
        .find(|m| m["id"] == model)
        .or_else(|| (data.len() == 1).then(|| &data[0]))?;
    positive(&entry["max_model_len"])
}

/// Ollama's `/api/show`: `num_ctx` when the model's parameters set it, else the model's own
/// `<arch>.context_length`.
fn ollama_show(show: &Value) -> Option<u64> {
    let set = show["parameters"].as_str().and_then(|p| {
        p.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("num_ctx"))
                .then(|| words.next()?.parse::<u64>().ok())
                .flatten()
        })
    });
    set.filter(|n| *n > 0).or_else(|| {
        show["model_info"]
            .as_object()?
            .iter()
            .find_map(|(key, value)| {
                key.ends_with(".context_length")
                    .then(|| positive(value))
                    .flatten()
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_servers_answer_gives_its_window() {
        let props = json!({"default_generation_settings": {"n_ctx": 2048}, "total_slots": 2});
        assert_eq!(llama_props(&props), Some(2048));
        assert_eq!(llama_props(&json!({"total_slots": 2})), None);
        let models = json!({"data": [{"id": "a", "max_model_len": 8192},
            {"id": "b", "max_model_len": 4096}]});
        assert_eq!(vllm_models(&models, "b"), Some(4096));
        assert_eq!(vllm_models(&models, "c"), None);
        let one = json!({"data": [{"id": "/models/x.gguf", "max_model_len": 1024}]});
        assert_eq!(vllm_models(&one, "gemma"), Some(1024));
        let show = json!({"parameters": "stop \"<eos>\"\nnum_ctx 8192",
            "model_info": {"llama.context_length": 131072}});
        assert_eq!(ollama_show(&show), Some(8192));
        let show = json!({"model_info": {"general.architecture": "llama",
            "llama.context_length": 131072}});
        assert_eq!(ollama_show(&show), Some(131_072));
        assert_eq!(root("http://127.0.0.1:8080/v1/"), "http://127.0.0.1:8080");
    }
}
