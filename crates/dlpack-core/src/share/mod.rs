//! What sharing memory between processes asks of the operating system (Linux), through
//! `rustix`'s bindings: no Python here, and nothing beyond std, rustix, libc (for the one call
//! rustix doesn't bind: open file description locks) and the core's `error` (whose `Os` and
//! `Limit` are a failed system call).
//!
//! ```text
//! memfd    sealed memory files (SealedFile, FileId): create, check, reopen; a peer's
//!          descriptor opened through /proc
//! lock     whole-file locks held by an open file description (flock), and the writers' lock
//!          of a shared tree (WriteLock: F_OFD_SETLK), which readers can see held, taken in
//!          turn by a process's threads (Writers)
//! mapping  a mapping of a whole sealed file (Mapping), unmapped on drop; populating it;
//!          which private pages this process wrote (pagemap); a read-only one (ReadMapping)
//! seqlock  a sequence lock over a word of shared memory (SeqLock): whole copies for readers
//!          that never write, never holding the writer up
//! tree     a shared pytree's segment: header, table of leaves, where each leaf lies
//!          (TreeLayout), written and read back checked
//! socket   Unix packet sockets at abstract addresses passing descriptors (Listener, Stream)
//! system   boot id, process and user ids, random bytes, memory and page sizes
//! handle_state  a handle's pickled state as bytes (HandleState), written and read
//! ```

pub mod handle_state;
pub mod lock;
pub mod mapping;
pub mod memfd;
pub mod seqlock;
pub mod socket;
pub mod system;
pub mod tree;

pub use mapping::{Mapping, ReadMapping, Writes, private_pages, private_pages_written};
pub use memfd::{FileId, SealedFile};
pub use socket::{Listener, Stream};
