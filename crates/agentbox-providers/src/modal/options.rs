//! What a modal provider is made with: [`ModalOptions`], its defaults, and where it reads them from
//! the environment.

use std::time::Duration;

use agentbox_core::Result;

use super::{ApiKey, DEFAULT_IMAGE, DEFAULT_SERVER_URL};

/// How the provider reaches Modal and what its boxes are made of.
#[derive(Clone, Debug)]
pub struct ModalOptions {
    /// Modal's API (`MODAL_SERVER_URL`, else [`DEFAULT_SERVER_URL`]).
    pub server_url: String,
    /// The token's id (`MODAL_TOKEN_ID`).
    pub token_id: Option<String>,
    /// The token's secret (`MODAL_TOKEN_SECRET`).
    pub token_secret: Option<ApiKey>,
    /// The Modal environment (`MODAL_ENVIRONMENT`); the account's default where unset.
    pub environment: Option<String>,
    /// The app the boxes belong to, made when missing (`AGENTBOX_MODAL_APP`, else
    /// `agentbox`).
    pub app: String,
    /// The image of a spec that names none.
    pub default_image: String,
    /// How long a connection to Modal may take to open.
    pub connect_timeout: Duration,
    /// How long a create may take, the image's build and the sandbox's start included.
    pub create_timeout: Duration,
    /// How many times an attach reads the facts in the box before it falls back on what the
    /// create measured, and the pause between tries.
    pub attach_tries: u32,
    /// The pause between two of those tries.
    pub attach_pause: Duration,
    /// Boxes are made able to take memory snapshots, and a snapshot is of the box's memory too
    /// (Modal's `SandboxSnapshot`): a box made from it resumes its programs where they were
    /// (`AGENTBOX_MODAL_MEMORY_SNAPSHOTS=1`). Off, a snapshot is of the files alone.
    pub memory_snapshots: bool,
}

impl Default for ModalOptions {
    fn default() -> Self {
        ModalOptions {
            server_url: DEFAULT_SERVER_URL.to_string(),
            token_id: None,
            token_secret: None,
            environment: None,
            app: "agentbox".to_string(),
            default_image: DEFAULT_IMAGE.to_string(),
            connect_timeout: Duration::from_secs(10),
            create_timeout: Duration::from_secs(300),
            attach_tries: 3,
            attach_pause: Duration::from_secs(1),
            memory_snapshots: false,
        }
    }
}

impl ModalOptions {
    /// The defaults, with what the `modal` client reads from the environment
    /// (`MODAL_SERVER_URL`, `MODAL_TOKEN_ID`, `MODAL_TOKEN_SECRET`, `MODAL_ENVIRONMENT`) and the
    /// app's name (`AGENTBOX_MODAL_APP`).
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// [`ModalOptions::from_env`] over `var` in place of the environment.
    ///
    /// ```
    /// use agentbox_providers::modal::ModalOptions;
    /// let o = ModalOptions::from_vars(|k| (k == "MODAL_SERVER_URL").then(|| "http://127.0.0.1:9000".to_string())).unwrap();
    /// assert_eq!(o.server_url, "http://127.0.0.1:9000");
    /// assert_eq!(o.app, "agentbox");
    /// ```
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let d = ModalOptions::default();
        Ok(ModalOptions {
            server_url: var("MODAL_SERVER_URL").unwrap_or(d.server_url.clone()),
            token_id: var("MODAL_TOKEN_ID"),
            token_secret: var("MODAL_TOKEN_SECRET").map(ApiKey::new),
            environment: var("MODAL_ENVIRONMENT"),
            app: var("AGENTBOX_MODAL_APP").unwrap_or(d.app.clone()),
            memory_snapshots: var("AGENTBOX_MODAL_MEMORY_SNAPSHOTS").is_some_and(|v| v == "1" || v == "true"),
            ..d
        })
    }
}
