//! Durable runs: a run is one directory, `runs/<id>/`, holding its store (SQLite in WAL: the
//! conversation, its tasks, the session's documents), its workspace, and `run.json` (id,
//! status, generation, holder, parent, a parked run's deadline).
//!
//! - [`Runs::open`] takes an exclusive claim (on one machine the directory's lock, which the
//!   kernel drops when the holder dies; across hosts a PostgreSQL lease, [`lease`]) and is the
//!   next generation. A second claim is refused, naming the holder.
//! - Every write to the store is fenced by the generation ([`store`]): a holder whose claim was
//!   taken learns it as a typed error, never by a silent lost write. So is the workspace: the
//!   programs a generation runs there are written down ([`programs`], [`Run::host_env`]), and
//!   the next generation ends them before its first step.
//! - [`Run::release`] seals the run (store checkpointed and synced) and gives up the claim;
//!   [`Run::park`] releases it with a deadline; [`Runs::fork`] copies a sealed run into new ones.
//! - [`moves`]: a planned move asks the holder to let the run go at its next step boundary,
//!   for a driver to start the next generation elsewhere.
//! - [`read_status`] reads a run from outside, with no claim; [`history::read`] its
//!   generations, as a timeline.
//! - [`agent`]: the agent loop over a [`agent::Model`] (a scripted one needs no key), its
//!   conversation persisted after every step, its tools through a transport to a box.

pub mod agent;
pub mod history;
pub mod lease;
pub mod moves;
pub mod programs;
pub mod record;
pub mod run;
pub mod store;

pub use moves::MoveRequest;
pub use record::{Holder, RunRecord, RunStatus, read_status};
pub use run::{Claim, ClaimKeeper, Run, Runs};
pub use store::{Journal, Message, Store};
