//! A project in a temporary directory whose provider is a mock LLM server, for the tests of
//! running delegations.

use summon_mock_llm::{MockConfig, MockServer};

use crate::config::{Config, load_config};
use crate::env::Env;
use crate::source::Catalog;

pub(super) struct MockProject {
    /// Dropped before the runtime it runs on.
    pub(super) server: MockServer,
    _runtime: tokio::runtime::Runtime,
    pub(super) dir: tempfile::TempDir,
    pub(super) env: Env,
}

impl MockProject {
    /// A project directory (`project/`, with `notes.md`) and an empty home directory; the
    /// model is `mock-model` behind the server's OpenAI-compatible endpoint.
    pub(super) fn start(config: MockConfig) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let server = runtime.block_on(MockServer::start(config));
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("project");
        let home = dir.path().join("home");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(root.join("notes.md"), "three notes\n").unwrap();
        let url = server.url_openai();
        let env = Env::for_test(
            root.canonicalize().unwrap(),
            &[
                ("HOME", home.to_str().unwrap()),
                ("OPENAI_BASE_URL", url.as_str()),
                ("OPENAI_API_KEY", "sk-test-0123456789abcdefDELEG"),
                ("SUMMON_MODEL", "mock-model"),
            ],
        );
        Self {
            server,
            _runtime: runtime,
            dir,
            env,
        }
    }

    pub(super) fn config(&self) -> Config {
        load_config(&self.env).unwrap().0
    }

    pub(super) fn catalog(&self) -> Catalog {
        crate::source::discover(crate::source::search_dirs(&self.env))
    }
}
