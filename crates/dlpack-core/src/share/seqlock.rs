//! A sequence lock over one word of shared memory: one writer at a time, any number of readers
//! in any process, which never write (a read-only mapping serves them) and never hold the
//! writer up. A reader copies what it reads, and keeps the copy only if the word shows that no
//! write began or ended meanwhile; otherwise it reads again.
//!
//! The word counts writes begun and ended: even while none is under way, odd while one is, and
//! half of it is the generation, the number of writes ended. A writer that dies mid-write leaves
//! it odd: readers see a write under way for good (and tell it from a live writer by the lock
//! writers hold, see `lock::WriteLock`), and the next writer, finding it odd, writes everything
//! again and ends that write, without beginning another.
//!
//! Orderings, as in Boehm's "Can seqlocks get along with programming language memory models?"
//! (2012): the writer stores the odd word, then a release fence, then the data, then the even
//! word with release; a reader loads the word with acquire, copies the data, then an acquire
//! fence, then loads the word again. A reader whose copy saw any of a write's data then sees
//! that write's odd word (or a later one) on its second load, and throws the copy away. The
//! data itself is copied as plain bytes: it lives in memory shared with other processes, which
//! may write it at any time; a copy that overlapped a write is never kept.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering, fence};

/// The sequence word of a segment.
#[derive(Clone, Copy)]
pub struct SeqLock<'a> {
    word: &'a AtomicU64,
}

/// That no other writer writes the data now: built by the writers' lock (`WriteLock`), given
/// this process's turn to write (`Writers`), which keeps the process's other threads out.
pub struct Exclusive<'a>(PhantomData<&'a ()>);

impl Exclusive<'_> {
    /// Said only by a writers' lock, or a test writing alone: two writers at once would make
    /// readers keep a torn copy as whole.
    pub(super) fn held() -> Self {
        Exclusive(PhantomData)
    }
}

/// A write under way: `end` it once the data is written. Dropped without ending (the write
/// failed halfway), the word stays odd, as a dead writer leaves it: readers refuse the data
/// until another write ends.
#[must_use = "a write must end for readers to see its data"]
pub struct Writing<'a> {
    word: &'a AtomicU64,
    odd: u64,
}

/// What one read attempt gives.
#[derive(Debug, PartialEq, Eq)]
pub enum Attempt<T> {
    /// The copy, whole, of this generation.
    Read { generation: u64, value: T },
    /// A write was under way when the read began (the word, odd): wait, or tell whether its
    /// writer lives.
    Writing(u64),
    /// A write began or ended during the copy: read again.
    Changed,
}

impl<'a> SeqLock<'a> {
    pub fn new(word: &'a AtomicU64) -> SeqLock<'a> {
        SeqLock { word }
    }

    /// The word now.
    pub fn load(&self) -> u64 {
        self.word.load(Ordering::Acquire)
    }

    /// Begin a write: the word turns odd (or stays odd, after a writer that died mid-write).
    pub fn begin_write(&self, _alone: &Exclusive<'_>) -> Writing<'a> {
        // Only a writer changes the word, and only one writes: this load sees the last store.
        let now = self.word.load(Ordering::Relaxed);
        let odd = now | 1;
        if odd != now {
            self.word.store(odd, Ordering::Relaxed);
        }
        // The odd word is visible before any of the data written after it.
        fence(Ordering::Release);
        Writing {
            word: self.word,
            odd,
        }
    }

    /// The word as a read begins: even, or `Err` with the odd word of a write under way.
    pub fn begin_read(&self) -> Result<u64, u64> {
        let begun = self.word.load(Ordering::Acquire);
        if begun & 1 == 1 {
            Err(begun)
        } else {
            Ok(begun)
        }
    }

    /// Whether what was read since `begin_read` gave `begun` is whole: no write began or ended
    /// since.
    pub fn validate(&self, begun: u64) -> bool {
        fence(Ordering::Acquire);
        self.word.load(Ordering::Relaxed) == begun
    }

    /// One attempt at reading with `copy`, which copies the data out (and is thrown away unless
    /// the attempt says `Read`).
    pub fn try_read<T>(&self, copy: impl FnOnce() -> T) -> Attempt<T> {
        let begun = match self.begin_read() {
            Ok(begun) => begun,
            Err(odd) => return Attempt::Writing(odd),
        };
        let value = copy();
        if self.validate(begun) {
            Attempt::Read {
                generation: generation(begun),
                value,
            }
        } else {
            Attempt::Changed
        }
    }
}

impl Writing<'_> {
    /// The generation this write makes.
    pub fn generation(&self) -> u64 {
        generation(self.odd + 1)
    }

    /// End the write: its data is the new generation's, which it returns.
    pub fn end(self) -> u64 {
        let even = self.odd.wrapping_add(1);
        self.word.store(even, Ordering::Release);
        generation(even)
    }
}

/// The generation an even word stands for (writes ended).
pub fn generation(word: u64) -> u64 {
    word >> 1
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use proptest::prelude::*;

    use super::*;

    /// A step of a simulated run: the writer's or a reader's next step, or the writer dying.
    #[derive(Clone, Copy, Debug)]
    enum Step {
        Writer,
        Reader(usize),
        WriterDies,
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        proptest::collection::vec(
            prop_oneof![
                6 => Just(Step::Writer),
                6 => (0..3usize).prop_map(Step::Reader),
                1 => Just(Step::WriterDies),
            ],
            0..400,
        )
    }

    /// A reader part way through a read: the word it began at and what it copied so far.
    #[derive(Default)]
    struct Reader {
        begun: Option<u64>,
        copied: Vec<u64>,
    }

    proptest! {
        /// Any interleaving of a writer's and readers' steps over cells of memory, the writer
        /// writing the generation it makes into every cell one at a time (and sometimes dying
        /// between two): every read the lock keeps holds one generation in every cell, the one
        /// it reports, and generations a reader sees never go back.
        #[test]
        fn reads_kept_are_whole(schedule in steps(), cells in 1..6usize) {
            let word = AtomicU64::new(0);
            let lock = SeqLock::new(&word);
            let memory: Vec<AtomicU64> = (0..cells).map(|_| AtomicU64::new(0)).collect();
            let mut writing: Option<(Writing<'_>, usize)> = None;
            let mut readers: Vec<Reader> = (0..3).map(|_| Reader::default()).collect();
            let mut last_seen = [0u64; 3];
            let mut ended = 0u64;
            for step in schedule {
                match step {
                    Step::Writer => match writing.take() {
                        None => writing = Some((lock.begin_write(&Exclusive::held()), 0)),
                        Some((write, at)) if at < cells => {
                            memory[at].store(write.generation(), Ordering::Relaxed);
                            writing = Some((write, at + 1));
                        }
                        Some((write, _)) => {
                            let made = write.generation();
                            prop_assert_eq!(write.end(), made);
                            prop_assert_eq!(made, ended + 1);
                            ended = made;
                        }
                    },
                    Step::WriterDies => drop(writing.take()), // the word stays odd
                    Step::Reader(k) => {
                        let reader = &mut readers[k];
                        match reader.begun {
                            None => match lock.begin_read() {
                                Ok(begun) => reader.begun = Some(begun),
                                Err(odd) => prop_assert!(odd & 1 == 1),
                            },
                            Some(_) if reader.copied.len() < cells => {
                                let at = reader.copied.len();
                                reader.copied.push(memory[at].load(Ordering::Relaxed));
                            }
                            Some(begun) => {
                                if lock.validate(begun) {
                                    let generation = generation(begun);
                                    prop_assert!(reader.copied.iter().all(|&v| v == generation));
                                    prop_assert!(generation >= last_seen[k]);
                                    prop_assert!(generation <= ended);
                                    last_seen[k] = generation;
                                }
                                *reader = Reader::default();
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_dead_writers_generation_is_written_again_by_the_next() {
        let word = AtomicU64::new(0);
        let lock = SeqLock::new(&word);
        assert_eq!(
            lock.try_read(|| 7),
            Attempt::Read {
                generation: 0,
                value: 7
            }
        );
        let write = lock.begin_write(&Exclusive::held());
        assert_eq!(write.generation(), 1);
        assert_eq!(lock.try_read(|| 7), Attempt::Writing(1));
        drop(write); // died
        assert_eq!(lock.begin_read(), Err(1));
        let again = lock.begin_write(&Exclusive::held());
        assert_eq!(again.generation(), 1);
        assert_eq!(again.end(), 1);
        assert_eq!(
            lock.try_read(|| 7),
            Attempt::Read {
                generation: 1,
                value: 7
            }
        );
        // A write beginning or ending during a copy.
        let during = lock.try_read(|| lock.begin_write(&Exclusive::held()).end());
        assert_eq!(during, Attempt::Changed);
        assert_eq!(generation(lock.load()), 2);
    }

    /// Threads for real: a writer making 10^4 generations of 64 cells while three readers read
    /// (the writer yielding between writes, as a learner computes between updates); every copy
    /// kept holds one generation, and once the writer is done a read gets the last one.
    #[test]
    fn threads_read_whole_generations() {
        const CELLS: usize = 64;
        const WRITES: u64 = 10_000;
        let word = AtomicU64::new(0);
        let memory: Vec<AtomicU64> = (0..CELLS).map(|_| AtomicU64::new(0)).collect();
        let done = AtomicBool::new(false);
        let copy = || {
            memory
                .iter()
                .map(|cell| cell.load(Ordering::Relaxed))
                .collect::<Vec<_>>()
        };
        std::thread::scope(|scope| {
            let readers: Vec<_> = (0..3)
                .map(|_| {
                    scope.spawn(|| {
                        let lock = SeqLock::new(&word);
                        let mut last = 0u64;
                        loop {
                            let finished = done.load(Ordering::Acquire);
                            if let Attempt::Read { generation, value } = lock.try_read(copy) {
                                assert!(value.iter().all(|&v| v == generation), "{value:?}");
                                assert!(generation >= last);
                                last = generation;
                                if finished {
                                    return generation;
                                }
                            }
                        }
                    })
                })
                .collect();
            let lock = SeqLock::new(&word);
            for _ in 0..WRITES {
                let write = lock.begin_write(&Exclusive::held());
                for cell in &memory {
                    cell.store(write.generation(), Ordering::Relaxed);
                }
                write.end();
                std::thread::yield_now();
            }
            done.store(true, Ordering::Release);
            for reader in readers {
                assert_eq!(reader.join().unwrap(), WRITES);
            }
        });
    }
}
