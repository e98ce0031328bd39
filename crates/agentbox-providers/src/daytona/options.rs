//! What a daytona provider is made with: [`DaytonaOptions`], its defaults, and where it reads them
//! from the environment.

use std::time::Duration;

use agentbox_core::{Error, Result};

use super::{ApiKey, DEFAULT_API_URL};
use crate::helper::HelperCommand;

/// How the provider reaches Daytona and what its boxes get.
#[derive(Clone, Debug)]
pub struct DaytonaOptions {
    /// The API (`DAYTONA_API_URL`, else `DAYTONA_SERVER_URL`, else [`DEFAULT_API_URL`]).
    pub api_url: String,
    /// The API key (`DAYTONA_API_KEY`).
    pub api_key: Option<ApiKey>,
    /// The region sandboxes are made in (`DAYTONA_TARGET`); Daytona's default when absent.
    pub target: Option<String>,
    /// The snapshot a spec naming none starts from (`AGENTBOX_DAYTONA_SNAPSHOT`); Daytona's
    /// default when absent.
    pub snapshot: Option<String>,
    /// A static `agentbox-runner` of this machine's, uploaded into each sandbox: each command
    /// and file operation is then one message through the sandbox's preview URL.
    pub runner: Option<HelperCommand>,
    /// Volumes every box mounts (each made when missing, and waited on until ready): files
    /// that outlive the box and that boxes share, such as a run's directory.
    pub volumes: Vec<super::VolumeMount>,
    /// How long Daytona's minute is: 60 s. Only a fake Daytona whose clock runs fast (a
    /// test's) has another, and both sides must agree.
    pub minute: Duration,
    /// How long a create may wait for its sandbox to start.
    pub start_timeout: Duration,
    /// How long a create may wait for the label index to show its box.
    pub index_timeout: Duration,
    /// How long a connection to Daytona may take to open.
    pub connect_timeout: Duration,
    /// How long one API call may take.
    pub request_timeout: Duration,
    /// The pause between polls of a program's spool.
    pub poll: Duration,
    /// How long a toolbox may fail every call before a program's wait is `timeout`.
    pub silent: Duration,
}

impl Default for DaytonaOptions {
    fn default() -> Self {
        DaytonaOptions {
            api_url: DEFAULT_API_URL.into(),
            api_key: None,
            target: None,
            snapshot: None,
            runner: None,
            volumes: Vec::new(),
            minute: Duration::from_secs(60),
            start_timeout: Duration::from_secs(180),
            index_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            poll: Duration::from_millis(150),
            silent: Duration::from_secs(60),
        }
    }
}

impl DaytonaOptions {
    /// The defaults, with what the `daytona` SDK reads from the environment (`DAYTONA_API_KEY`,
    /// `DAYTONA_API_URL` or `DAYTONA_SERVER_URL`, `DAYTONA_TARGET`) and
    /// `AGENTBOX_DAYTONA_SNAPSHOT`.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// [`DaytonaOptions::from_env`] over `var` in place of the environment.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut o = DaytonaOptions::default();
        if let Some(u) = var("DAYTONA_API_URL").or_else(|| var("DAYTONA_SERVER_URL")) {
            o.api_url = u;
        }
        o.api_key = var("DAYTONA_API_KEY").map(ApiKey::new);
        if o.api_key.is_none() && var("DAYTONA_JWT_TOKEN").is_some() {
            return Err(Error::unsupported(
                "DAYTONA_JWT_TOKEN: agentbox authenticates with an API key only; set DAYTONA_API_KEY",
            ));
        }
        o.target = var("DAYTONA_TARGET");
        o.snapshot = var("AGENTBOX_DAYTONA_SNAPSHOT");
        Ok(o)
    }
}
