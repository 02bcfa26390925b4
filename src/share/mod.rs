//! Sharing host memory with other processes of this machine (`dlpack.share`, `empty_shared`,
//! `SharedHandle`), Linux only. `os` is what it asks of the operating system (no Python); the
//! rest builds segments on it, lends them, opens them where handles arrive, and gives Python
//! `DLPackObject`s over them.
//!
//! ```text
//! os           memory files, locks, mappings, sockets, ids (no Python)
//! segment      a memory file at one generation (its trailer) and its mapping here (Mapped);
//!              create, reuse, adopt
//! registry     live segments by address and by file
//! pool         kept segments of fresh copies, for reuse
//! lender       this process's lender thread: tokens pinning segments for receivers
//! client       connections to other processes' lenders: claims and releases
//! open         a handle's segment where it arrives (mapped already, /proc, or claimed)
//! per_process  process-wide state a forked child starts afresh
//! views        segments as DLPackObjects; what share and empty_shared make
//! handle       a handle's pickled state: written, checked and opened
//! python       the functions dlpack._sharing calls
//! ```

mod client;
mod handle;
mod lender;
mod open;
pub mod os;
mod per_process;
mod pool;
mod python;
mod registry;
mod segment;
mod views;

pub use python::register;
pub use segment::Mapped;
