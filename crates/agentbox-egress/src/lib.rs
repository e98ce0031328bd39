//! agentbox's egress proxy: what a box with `network: { allow: [...] }` reaches the world
//! through, and the only thing it can reach.
//!
//! A box with an allowlist has no route but to the proxy (its own network namespace with
//! loopback alone, or a container with no network, and a bridge to the proxy's socket), so a
//! program that ignores `HTTP_PROXY` reaches nothing at all. The proxy takes HTTP `CONNECT`
//! (what `HTTPS_PROXY` makes a client send) and plain HTTP in absolute form (`HTTP_PROXY`), and
//! for each:
//!
//! 1. checks the name against the list before resolving it (an address written as the host is
//!    checked as an address: it must be in a listed CIDR);
//! 2. resolves the name, and checks each address against the listed CIDRs and against the
//!    ranges never allowed unless a CIDR lists them ([`policy::never_allowed`]: loopback,
//!    link-local with the cloud metadata address, private and shared ranges, this machine's
//!    own addresses), so a listed name that resolves inside cannot be used to reach in;
//! 3. connects to the address it checked, never resolving again, so a name that answers
//!    differently between the check and the connect (DNS rebinding) cannot pass.
//!
//! Every refusal is answered `403` to the client and handed to the proxy's
//! [`Refusals`] sink (time, host, port, rule, why): the daemon writes them as JSON lines,
//! `agentbox box net ID` reads them.
//!
//! ```no_run
//! # async fn f() -> std::io::Result<()> {
//! use std::sync::Arc;
//! use agentbox_core::Allowlist;
//! use agentbox_egress::{Policy, Proxy, SystemResolver};
//! let policy = Policy::new(Allowlist::parse(&["*.crates.io:443".into()]).unwrap());
//! let proxy = Proxy::new(policy, Arc::new(SystemResolver), Arc::new(|r| eprintln!("{r:?}")));
//! let listener = tokio::net::UnixListener::bind("/tmp/egress.sock")?;
//! loop {
//!     let (conn, _) = listener.accept().await?;
//!     let proxy = proxy.clone();
//!     tokio::spawn(async move { proxy.serve(conn).await });
//! }
//! # }
//! ```

mod intercept;
pub mod policy;
mod proxy;
mod refusal;
mod resolve;
mod secrets;

pub use intercept::Interceptor;
pub use policy::{Decision, Policy};
pub use proxy::{PROBE_PATH, Proxy, Refusals};
pub use refusal::{Refusal, RefusalLog, read_refusals};
pub use resolve::{Resolver, SystemResolver};
pub use secrets::{Leak, SecretPlan, SecretRule, Secrets};
