//! Sharing host memory with other processes of this machine (`dlpack.share`, `empty_shared`,
//! `SharedHandle`), Linux only. `dlpack_core::share` is what it asks of the operating system; the
//! rest builds segments on it, lends them, opens them where handles arrive, and gives Python
//! `DLPackObject`s over them.
//!
//! ```text
//! pool         a segment's files (Files), and those of fresh copies kept for reuse
//! segment      a memory file at one generation (its trailer), as this process holds it
//! registry     mappings by address and by file
//! mapped       this process's mappings of segments (Mapped, what views hold), registered;
//!              segments made, reused, or adopted from a descriptor received
//! board        a lender's release board: one word per pinned token, cleared by receivers
//! lender       this process's lender thread: tokens pinning segments for receivers
//! client       other processes' lenders: boards to release on, connections to claim on
//! limits       the errors of sharing at a limit of open files
//! open         a handle's segment where it arrives (mapped already, /proc, or claimed)
//! per_process  process-wide state a forked child starts afresh
//! views        segments as DLPackObjects; what share and empty_shared make
//! handle       SharedHandle, the Python class, and its reconstructor
//! state        a handle's pickled state (one bytes): written, checked and opened
//! tree         pytrees shared as one segment (TreeSegment): made, opened, updated and read
//!              as consistent snapshots under the segment's sequence lock
//! python       the functions dlpack._sharing calls, and what the tests count
//! ```

mod board;
mod client;
mod handle;
mod lender;
mod limits;
pub mod mapped;
mod open;
mod per_process;
mod pool;
mod python;
mod registry;
mod segment;
mod state;
mod tree;
mod views;

pub use python::{counts, register};
