//! A lender's release board: a small memory file with one word per pinned token, which
//! receivers map (once per producer, through /proc) to release a token by clearing its word:
//! no message, and no thread of the producer woken for each handle opened (on a small machine
//! that wake-up cost more than all the rest of opening a handle mapped already). The lender
//! reads the words when it next looks (see `lender`). A token names its word: its index and
//! the nonce written there.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};

use dlpack_core::error::{Error, Result};
use dlpack_core::share::memfd::open_peer;
use dlpack_core::share::{Mapping, SealedFile, Writes};

/// Words on a board: tokens pinned beyond these are released by message.
pub const SLOTS: u32 = 4096;

/// The header: the lender's id, the number of words, and how many releases receivers made.
const HEADER: usize = 24;
const RELEASES: usize = 16;

fn size() -> u64 {
    (HEADER + 8 * SLOTS as usize) as u64
}

#[derive(Debug)]
pub struct Board {
    mapping: Mapping,
    file: SealedFile,
}

impl Board {
    /// A new board of the lender `id`, every word free.
    pub fn create(id: u64) -> Result<Board> {
        let file = SealedFile::create(c"dlpack-lender-board", size())?;
        let mapping = Mapping::new(&file, Writes::Shared, false)?;
        mapping.write_word(0, id);
        mapping.write_word(8, u64::from(SLOTS));
        Ok(Board { mapping, file })
    }

    /// The board of the lender `id` of process `pid`, its descriptor `fd` there (opened through
    /// /proc, and checked to be that lender's board).
    pub fn open(pid: i32, fd: i32, id: u64) -> Result<Board> {
        let file = SealedFile::check(open_peer(pid, fd, true)?, None, size(), true)?;
        let mapping = Mapping::new(&file, Writes::Shared, false)?;
        if mapping.read_word(0) != id || mapping.read_word(8) != u64::from(SLOTS) {
            return Err(Error::buffer("not the lender's board"));
        }
        Ok(Board { mapping, file })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.fd()
    }

    fn word(&self, index: u32) -> Option<&AtomicU64> {
        (index < SLOTS).then(|| self.mapping.atomic_word(HEADER + 8 * index as usize))
    }

    /// Write `nonce` (not 0) in the free word `index`: pinned.
    pub fn pin(&self, index: u32, nonce: u64) {
        if let Some(word) = self.word(index) {
            word.store(nonce, Ordering::Release);
        }
    }

    /// Whether word `index` still holds `nonce` (not released).
    pub fn holds(&self, index: u32, nonce: u64) -> bool {
        self.word(index)
            .is_some_and(|word| word.load(Ordering::Acquire) == nonce)
    }

    /// Release word `index` if it holds `nonce`, and count the release: false when it does
    /// not (released already, or pinned again for another token).
    pub fn release(&self, index: u32, nonce: u64) -> bool {
        let released = nonce != 0
            && self.word(index).is_some_and(|word| {
                word.compare_exchange(nonce, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            });
        if released {
            self.mapping
                .atomic_word(RELEASES)
                .fetch_add(1, Ordering::AcqRel);
        }
        released
    }

    /// How many releases receivers made: when it has not changed, no word was released since.
    /// (A release clears its word before it counts, so a count read before looking at the
    /// words misses none.)
    pub fn releases(&self) -> u64 {
        self.mapping.atomic_word(RELEASES).load(Ordering::Acquire)
    }

    /// Free word `index`, whatever it holds.
    pub fn clear(&self, index: u32) {
        if let Some(word) = self.word(index) {
            word.store(0, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;
    use dlpack_core::share::system;

    #[test]
    fn receivers_release_what_lenders_pin() {
        let board = Board::create(7).unwrap();
        let theirs = Board::open(system::pid(), board.fd().as_raw_fd(), 7).unwrap();
        assert!(Board::open(system::pid(), board.fd().as_raw_fd(), 8).is_err());

        board.pin(3, 99);
        assert!(board.holds(3, 99));
        assert_eq!(board.releases(), 0);
        assert!(!theirs.release(3, 98));
        assert!(!theirs.release(3, 0));
        assert!(theirs.release(3, 99));
        assert!(!board.holds(3, 99));
        assert_eq!(board.releases(), 1);
        assert!(!theirs.release(3, 99)); // once
        board.pin(3, 100);
        board.clear(3);
        assert!(!board.holds(3, 100));
        assert!(!board.holds(SLOTS, 0));
        assert!(!theirs.release(SLOTS, 1));
    }
}
