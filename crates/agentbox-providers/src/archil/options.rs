//! What a archil provider is made with: [`ArchilOptions`], its defaults, and where it reads them
//! from the environment.

use std::time::Duration;

use agentbox_core::{Error, Result};

use super::{ApiKey, EXEC_LIMIT, OWN_DEADLINE};

/// How the provider reaches Archil and which disk its boxes live on.
#[derive(Clone, Debug)]
pub struct ArchilOptions {
    /// The control plane (`ARCHIL_BASE_URL`, else the region's).
    pub base_url: String,
    /// The object API (`ARCHIL_S3_BASE_URL`, else the control plane's host with `control.`
    /// made `s3.`, as the SDK derives it).
    pub s3_base_url: String,
    /// The region (`ARCHIL_REGION`), where one was named.
    pub region: Option<String>,
    /// The API key (`ARCHIL_API_KEY`).
    pub api_key: Option<ApiKey>,
    /// The work disk, by id (`dsk-…`) or by name (`ARCHIL_DISK`). Never the disk of a run's
    /// store: boxes on a disk can reach all of it.
    pub disk: Option<String>,
    /// How long an exec (and an upload, retrying) may wait for another process's command on
    /// the same box: Archil's `queueMs`.
    pub queue: Duration,
    /// How long destroy waits for a running command before it leaves the directory to the
    /// next list's sweep.
    pub destroy_wait: Duration,
    /// The longest one exec call may run ([`EXEC_LIMIT`]); a test against a fake whose limit
    /// is scaled down sets both.
    pub exec_limit: Duration,
    /// The deadline a command gets at most ([`OWN_DEADLINE`]).
    pub own_deadline: Duration,
    /// How long a connection to Archil may take to open.
    pub connect_timeout: Duration,
    /// How long one API call other than an exec may take.
    pub request_timeout: Duration,
}

impl Default for ArchilOptions {
    fn default() -> Self {
        ArchilOptions {
            base_url: String::new(),
            s3_base_url: String::new(),
            region: None,
            api_key: None,
            disk: None,
            queue: Duration::from_secs(60),
            destroy_wait: Duration::from_secs(5),
            exec_limit: EXEC_LIMIT,
            own_deadline: OWN_DEADLINE,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
        }
    }
}

impl ArchilOptions {
    /// The defaults, with what the `archil` SDK reads from the environment (`ARCHIL_API_KEY`,
    /// `ARCHIL_REGION`, `ARCHIL_S3_BASE_URL`), the control plane's `ARCHIL_BASE_URL` (the SDK's
    /// `base_url`) and the disk (`ARCHIL_DISK`).
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// [`ArchilOptions::from_env`] over `var` in place of the environment.
    ///
    /// ```
    /// use agentbox_providers::archil::ArchilOptions;
    /// let o = ArchilOptions::from_vars(|k| (k == "ARCHIL_REGION").then(|| "aws-eu-west-1".to_string())).unwrap();
    /// assert_eq!(o.s3_base_url, "https://s3.green.eu-west-1.aws.prod.archil.com");
    /// ```
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut o = ArchilOptions {
            region: var("ARCHIL_REGION"),
            api_key: var("ARCHIL_API_KEY").map(ApiKey::new),
            disk: var("ARCHIL_DISK"),
            ..Default::default()
        };
        o.base_url = match (var("ARCHIL_BASE_URL"), &o.region) {
            (Some(u), _) => u,
            (None, Some(r)) => region_url(r)?.to_string(),
            (None, None) => {
                return Err(Error::invalid(
                    "ARCHIL_REGION: name the region of the disk (aws-us-east-1, aws-us-west-2, aws-eu-west-1, \
                     gcp-us-central1), or set ARCHIL_BASE_URL",
                ));
            }
        };
        o.s3_base_url = var("ARCHIL_S3_BASE_URL").unwrap_or_else(|| s3_url_of(&o.base_url));
        Ok(o)
    }
}

/// Archil's regions and their control planes, as the `archil` SDK (0.18) knows them.
pub const REGIONS: [(&str, &str); 4] = [
    ("aws-us-east-1", "https://control.green.us-east-1.aws.prod.archil.com"),
    ("aws-us-west-2", "https://control.green.us-west-2.aws.prod.archil.com"),
    ("aws-eu-west-1", "https://control.green.eu-west-1.aws.prod.archil.com"),
    (
        "gcp-us-central1",
        "https://control.blue.us-central1.gcp.prod.archil.com",
    ),
];

/// The control plane of `region`; `invalid` naming every region for one Archil has not.
pub fn region_url(region: &str) -> Result<&'static str> {
    REGIONS
        .iter()
        .find(|(r, _)| *r == region)
        .map(|(_, u)| *u)
        .ok_or_else(|| {
            let all: Vec<&str> = REGIONS.iter().map(|(r, _)| *r).collect();
            Error::invalid(format!(
                "ARCHIL_REGION: {region:?} is not an Archil region ({})",
                all.join(", ")
            ))
        })
}

/// The object API beside a control plane: a leading `control.` of its host made `s3.`; a host
/// without one is used as it is (as the SDK derives it).
pub fn s3_url_of(control: &str) -> String {
    match reqwest::Url::parse(control) {
        Ok(mut u) => {
            if let Some(host) = u
                .host_str()
                .and_then(|h| h.strip_prefix("control."))
                .map(|h| format!("s3.{h}"))
            {
                let _ = u.set_host(Some(&host));
            }
            u.as_str().trim_end_matches('/').to_string()
        }
        Err(_) => control.trim_end_matches('/').to_string(),
    }
}
