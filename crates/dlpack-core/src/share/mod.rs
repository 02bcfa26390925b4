//! What sharing memory between processes asks of the operating system (Linux), through
//! `rustix`'s bindings: no Python here, and nothing beyond std, rustix and the core's `error`
//! (whose `Os` and `Limit` are a failed system call).
//!
//! ```text
//! memfd    sealed memory files (SealedFile, FileId): create, check, reopen; a peer's
//!          descriptor opened through /proc
//! lock     whole-file locks held by an open file description (flock)
//! mapping  a mapping of a whole sealed file (Mapping), unmapped on drop; populating it;
//!          which private pages this process wrote (pagemap)
//! socket   Unix packet sockets at abstract addresses passing descriptors (Listener, Stream)
//! system   boot id, process and user ids, random bytes, memory and page sizes
//! handle_state  a handle's pickled state as bytes (HandleState), written and read
//! ```

pub mod handle_state;
pub mod lock;
pub mod mapping;
pub mod memfd;
pub mod socket;
pub mod system;

pub use mapping::{Mapping, Writes, private_pages, private_pages_written};
pub use memfd::{FileId, SealedFile};
pub use socket::{Listener, Stream};
