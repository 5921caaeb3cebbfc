//! `summon mcp --http ADDR` and `--socket PATH`: streamable HTTP that answers its owner only.
//!
//! Over TCP every request must carry `Authorization: Bearer TOKEN`, a token made at start
//! and written to a file only the user can read (its path is printed); any other request
//! gets 401 before it reaches a session. A UNIX socket is made readable and writable by the
//! user alone, which is the same rule. Live sessions are capped (`--max-sessions`): a new one
//! past the cap takes the place of the oldest that has called no tool, else it is refused
//! with 503. A session that calls no tool ends after `--idle-session-secs`; one that did, after
//! ten minutes without a request. Each session sees only the tasks it started.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use axum::middleware::Next;

/// The largest request body read (a tool call's arguments are far smaller).
const MAX_BODY: usize = 16 << 20;
use rmcp::transport::streamable_http_server::session::SessionManager as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use super::session::Session;
use super::{Options, Server, Shared, shared, stop};
use crate::env::Env;
use crate::error::{Error, Result};

/// How long a session that called a tool lives without a request.
const KEEP_ALIVE: Duration = Duration::from_secs(600);
/// The header of a session's id.
const SESSION_HEADER: &str = "mcp-session-id";

/// Where the server listens.
#[derive(Debug, Clone)]
pub(crate) enum Listen {
    /// A TCP address; the requests need the bearer token.
    Tcp(std::net::SocketAddr),
    /// A UNIX socket at this path, only the user's.
    Unix(PathBuf),
}

/// The gate in front of the sessions.
struct Gate {
    /// `None` on a UNIX socket.
    token: Option<String>,
    sessions: Arc<LocalSessionManager>,
    max_sessions: usize,
    idle: Duration,
    /// Each live session: when it started and when it last had a request.
    seen: Mutex<HashMap<String, (Instant, Instant)>>,
    shared: Arc<Shared>,
}

impl Gate {
    fn authorized(&self, request: &Request<Body>) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        constant_time_eq(given.trim().as_bytes(), token.as_bytes())
    }

    async fn check(self: Arc<Self>, request: Request<Body>, next: Next) -> Response<Body> {
        if !self.authorized(&request) {
            let mut response = plain(
                StatusCode::UNAUTHORIZED,
                "summon mcp: this server answers its owner only: send `Authorization: Bearer TOKEN` with the token in the file summon mcp printed at start\n",
            );
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return response;
        }
        let session = request
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        match &session {
            Some(id) => {
                if let Ok(mut seen) = self.seen.lock()
                    && let Some((_, last)) = seen.get_mut(id)
                {
                    *last = Instant::now();
                }
            }
            None if request.method() == axum::http::Method::POST => {
                if let Err(response) = self.make_room().await {
                    return response;
                }
            }
            None => {}
        }
        // A call whose arguments write a key twice is noted before the session reads it.
        let request = match (&session, request.method() == axum::http::Method::POST) {
            (Some(id), true) => {
                let (parts, body) = request.into_parts();
                let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY).await else {
                    return plain(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "summon mcp: the request is too large\n",
                    );
                };
                self.shared.duplicates.check(id, &bytes);
                Request::from_parts(parts, Body::from(bytes))
            }
            _ => request,
        };
        let response = next.run(request).await;
        if session.is_none()
            && let Some(id) = response
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
            && let Ok(mut seen) = self.seen.lock()
        {
            let now = Instant::now();
            seen.insert(id.to_owned(), (now, now));
        }
        response
    }

    /// Room for one more session: past the cap, the oldest that called no tool ends.
    async fn make_room(&self) -> std::result::Result<(), Response<Body>> {
        let live = self.sessions.sessions.read().await.len();
        if live < self.max_sessions {
            return Ok(());
        }
        let oldest = {
            let used = self.used();
            let seen = self.seen.lock().map_err(|_| busy(self.max_sessions))?;
            seen.iter()
                .filter(|(id, _)| !used.contains(*id))
                .min_by_key(|(_, (started, _))| *started)
                .map(|(id, _)| id.clone())
        };
        match oldest {
            Some(id) => {
                self.close(&id).await;
                Ok(())
            }
            None => Err(busy(self.max_sessions)),
        }
    }

    /// The sessions that called a tool.
    fn used(&self) -> HashSet<String> {
        self.shared
            .used_sessions
            .lock()
            .map(|used| used.clone())
            .unwrap_or_default()
    }

    async fn close(&self, id: &str) {
        let _ = self.sessions.close_session(&Arc::from(id)).await;
        if let Ok(mut seen) = self.seen.lock() {
            seen.remove(id);
        }
        if let Ok(mut used) = self.shared.used_sessions.lock() {
            used.remove(id);
        }
    }

    /// Ends the sessions past their time, every quarter of the idle time.
    async fn expire(self: Arc<Self>) {
        let every = (self.idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            tokio::time::sleep(every).await;
            let used = self.used();
            let ended: Vec<String> = match self.seen.lock() {
                Ok(seen) => seen
                    .iter()
                    .filter(|(id, (started, last))| {
                        if used.contains(*id) {
                            last.elapsed() >= KEEP_ALIVE
                        } else {
                            started.elapsed() >= self.idle
                        }
                    })
                    .map(|(id, _)| id.clone())
                    .collect(),
                Err(_) => Vec::new(),
            };
            for id in ended {
                self.close(&id).await;
            }
        }
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::from(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn busy(max: usize) -> Response<Body> {
    let mut response = Response::new(Body::from(format!(
        "summon mcp: {max} sessions are live and each has called a tool: the most at once (--max-sessions). End one, or try again later\n"
    )));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    response
}

/// Whether two byte strings are equal, in a time that does not depend on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// A new token: 32 random bytes, as hex.
fn new_token() -> String {
    use rand::RngCore as _;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// The folder of the token files: `$XDG_RUNTIME_DIR/summon`, else `summon/mcp` of the state
/// folder; made only the user's.
fn token_dir(env: &Env) -> Result<PathBuf> {
    let base = env
        .var("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute() && dir.is_dir())
        .map(|dir| dir.join("summon"))
        .or_else(|| env.state_dir().map(|dir| dir.join("summon").join("mcp")))
        .ok_or_else(|| {
            Error::usage("--http: no home folder to keep the bearer token in; set HOME or XDG_RUNTIME_DIR, or use --socket")
        })?;
    std::fs::create_dir_all(&base).map_err(|e| Error::Write {
        path: base.clone(),
        source: e,
    })?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
        Error::Write {
            path: base.clone(),
            source: e,
        }
    })?;
    Ok(base)
}

/// Writes `token` to a new file only the user can read and write.
fn write_token(path: &Path, token: &str) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut file| {
            file.write_all(token.as_bytes())?;
            file.write_all(b"\n")?;
            Ok(file)
        })
        .map_err(|e| Error::Write {
            path: path.to_path_buf(),
            source: e,
        })?;
    file.flush()?;
    Ok(())
}

/// Serves the project over streamable HTTP at `/mcp` until summon is stopped (SIGTERM,
/// SIGINT, SIGHUP); then the foreground tasks stop as they do over stdio.
pub(crate) fn serve_http(env: Env, options: Options, listen: Listen) -> Result<()> {
    let shared = shared(env, options);
    let runtime = super::runtime()?;
    let token_file = match &listen {
        Listen::Tcp(_) => {
            Some(token_dir(&shared.env)?.join(format!("mcp-{}.token", std::process::id())))
        }
        Listen::Unix(_) => None,
    };
    let token = token_file.as_ref().map(|_| new_token());
    if let (Some(path), Some(token)) = (&token_file, &token) {
        write_token(path, token)?;
    }
    let mut manager = LocalSessionManager::default();
    manager.session_config.keep_alive = Some(KEEP_ALIVE);
    let sessions = Arc::new(manager);
    let gate = Arc::new(Gate {
        token,
        sessions: Arc::clone(&sessions),
        max_sessions: shared.options.max_sessions,
        idle: shared.options.idle_session,
        seen: Mutex::new(HashMap::new()),
        shared: Arc::clone(&shared),
    });
    let mut config = StreamableHttpServerConfig::default();
    if let Listen::Tcp(addr) = &listen
        && !addr.ip().is_loopback()
    {
        // Allowed with --allow-remote: the address itself is a valid Host.
        config = config.with_allowed_hosts([addr.ip().to_string(), addr.to_string()]);
    }
    config.cancellation_token = shared.shutdown.clone();
    let for_sessions = Arc::clone(&shared);
    let (listen_at, token_at) = (&listen, token_file.as_deref());
    let signal = runtime.block_on(async move {
        let signals = stop::Signals::new()?;
        let service = StreamableHttpService::new(
            move || {
                Ok(Server {
                    shared: Arc::clone(&for_sessions),
                    session: Arc::new(Session::new(for_sessions.options.share_tasks)),
                })
            },
            sessions,
            config,
        );
        let check = Arc::clone(&gate);
        let router =
            axum::Router::new()
                .nest_service("/mcp", service)
                .layer(axum::middleware::from_fn(move |request, next| {
                    Arc::clone(&check).check(request, next)
                }));
        tokio::spawn(Arc::clone(&gate).expire());
        let served = async {
            match listen_at {
                Listen::Tcp(addr) => {
                    let listener = tokio::net::TcpListener::bind(addr)
                        .await
                        .map_err(|e| Error::usage(format!("--http {addr}: cannot listen: {e}")))?;
                    let local = listener.local_addr()?;
                    eprintln!("summon: serving MCP at http://{local}/mcp");
                    if let Some(path) = token_at {
                        eprintln!(
                            "summon: requests need `Authorization: Bearer TOKEN`, the token in {}",
                            path.display()
                        );
                    }
                    axum::serve(listener, router).await?;
                }
                Listen::Unix(path) => {
                    let listener = bind_private(path)?;
                    eprintln!("summon: serving MCP on the socket {}", path.display());
                    axum::serve(listener, router).await?;
                }
            }
            Ok::<(), Error>(())
        };
        tokio::select! {
            served = served => served.map(|()| None),
            signal = signals.next() => Ok(Some(signal)),
        }
    });
    let signal = match signal {
        Ok(signal) => signal,
        Err(e) => {
            remove_files(&listen, token_file.as_deref());
            stop::finish(&shared, runtime, None);
            return Err(e);
        }
    };
    remove_files(&listen, token_file.as_deref());
    stop::finish(&shared, runtime, signal);
    Ok(())
}

/// The token file and the socket go with the server.
fn remove_files(listen: &Listen, token_file: Option<&Path>) {
    if let Some(path) = token_file {
        let _ = std::fs::remove_file(path);
    }
    if let Listen::Unix(path) = listen {
        let _ = std::fs::remove_file(path);
    }
}

/// A UNIX socket at `path` that only the user may connect to: made with a umask that leaves
/// others no permission, so it is never open to them.
fn bind_private(path: &Path) -> Result<tokio::net::UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt as _;
        if !meta.file_type().is_socket() {
            return Err(Error::usage(format!(
                "--socket {}: exists and is not a socket",
                path.display()
            )));
        }
        let _ = std::fs::remove_file(path);
    }
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = tokio::net::UnixListener::bind(path);
    nix::sys::stat::umask(old);
    bound.map_err(|e| Error::usage(format!("--socket {}: cannot listen: {e}", path.display())))
}
