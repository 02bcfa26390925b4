//! A batch of contiguous copies run as one copy of their total size: the threads and stores
//! chosen for a contiguous copy of that many bytes (measured as [`super::tune`] measures any),
//! the bytes cut between the threads whatever run they lie in. Many runs of a few MiB each
//! (a shared tree's leaves) would each take one thread and ordinary stores, as a copy of a
//! few MiB does, where one copy of all their bytes streams or splits.

use std::time::Instant;

use super::engine::{Config, residency};
use super::tune::{self, Band, Choice, Class, Key, Limits, Lookup, Memory, ONE_THREAD};

/// One contiguous copy of a batch: `len` bytes from `src` to `dst`.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    pub dst: *mut u8,
    pub src: *const u8,
    pub len: usize,
}

/// The runs, and where each starts in the stream of all their bytes.
struct Batch<'a> {
    runs: &'a [Run],
    starts: Vec<usize>,
    total: usize,
}

/// The batch handed to worker threads.
#[derive(Clone, Copy)]
struct Shared<'a>(&'a Batch<'a>);
// SAFETY: the batch only carries addresses the caller keeps valid for the whole (scoped) copy,
// and the threads copy disjoint bytes of it.
unsafe impl Send for Shared<'_> {}
// SAFETY: sharing it hands out only the addresses the caller keeps valid for the scoped
// copy; the threads read the batch itself, never write it, and copy disjoint bytes.
unsafe impl Sync for Shared<'_> {}
impl<'a> Shared<'a> {
    /// The batch (a method, so that closures take the `Shared`, not its field).
    fn get(self) -> &'a Batch<'a> {
        self.0
    }
}

/// Copy every run (`len` bytes from `src` to `dst`), as one contiguous copy of their total
/// size chooses its threads and stores: below [`PARALLEL_THRESHOLD`](super::PARALLEL_THRESHOLD)
/// bytes in all one thread with ordinary stores, each run one `memcpy`; from there as measured
/// on this machine for a contiguous copy of the total's band (the first such batch or copy
/// measures, on chunks of its own bytes). Never touches Python and never panics.
///
/// # Safety
/// Every run's `len` bytes at `src` are readable and at `dst` writable for the whole call;
/// no run's destination overlaps any run's source or another run's destination.
pub unsafe fn copy_runs(runs: &[Run]) {
    // SAFETY: this function's contract, all that `copy_runs_with` needs.
    unsafe { copy_runs_with(runs, Config::new()) }
}

/// [`copy_runs`] with an explicit configuration.
///
/// # Safety
/// As for [`copy_runs`].
pub(super) unsafe fn copy_runs_with(runs: &[Run], config: Config) {
    let mut starts = Vec::with_capacity(runs.len());
    let mut total = 0usize;
    for run in runs {
        starts.push(total);
        // The runs are memory the caller holds, disjoint: their sum fits in the address space.
        total = total.saturating_add(run.len);
    }
    let batch = Batch {
        runs,
        starts,
        total,
    };
    if let Some(choice) = config.forced {
        // SAFETY: all of the batch (the contract).
        return unsafe { batch.run(0, total, choice.threads, choice.streaming) };
    }
    let tuner = config.tuner;
    let limits = &tuner.limits;
    let key = Band::of(total, limits).map(|band| Key {
        class: Class::Contiguous,
        band,
        memory: batch.memory_at_start(),
    });
    let choice = match key.map(|key| tuner.lookup(key)) {
        None => ONE_THREAD,
        Some(Lookup::Known(choice)) => choice,
        // SAFETY: all of the batch (the contract).
        Some(Lookup::Measure(cal)) => return unsafe { batch.calibrate(cal, limits) },
    };
    let threads = limits.threads_for(total, choice);
    // SAFETY: all of the batch (the contract).
    unsafe { batch.run(0, total, threads, choice.streaming) }
}

impl Batch<'_> {
    /// Whether the first destination page is in memory: a batch's destination (one segment,
    /// one buffer) is fresh, or not, as a whole, nearly always.
    fn memory_at_start(&self) -> Memory {
        match self.runs.iter().find(|run| run.len > 0) {
            Some(run) => match residency((run.dst as usize, run.dst as usize + 1)) {
                Some((0, _)) => Memory::Fresh,
                _ => Memory::Mapped,
            },
            None => Memory::Mapped,
        }
    }

    /// The pieces of runs that bytes `[from, to)` of the stream are: (run, offset in it, len).
    fn pieces(&self, from: usize, to: usize) -> impl Iterator<Item = (&Run, usize, usize)> {
        let first = self
            .starts
            .partition_point(|&s| s <= from)
            .saturating_sub(1);
        (first..self.runs.len())
            .map(move |k| (&self.runs[k], self.starts[k]))
            .take_while(move |&(_, start)| start < to)
            .filter_map(move |(run, start)| {
                let lo = from.max(start);
                let hi = to.min(start.saturating_add(run.len));
                (lo < hi).then(|| (run, lo - start, hi - lo))
            })
    }

    /// Copy bytes `[from, to)` of the stream on this thread.
    ///
    /// # Safety
    /// The runs hold as [`copy_runs`] says.
    unsafe fn copy_range(&self, from: usize, to: usize, streaming: bool) {
        for (run, at, len) in self.pieces(from, to) {
            let (d, s) = (run.dst.wrapping_add(at), run.src.wrapping_add(at));
            #[cfg(target_arch = "x86_64")]
            if streaming {
                // SAFETY: `len` bytes inside one run, readable at `s`, writable at `d`, apart
                // (the contract).
                unsafe { super::simd::copy_streaming(d, s, len) };
                continue;
            }
            // SAFETY: `len` bytes inside one run, readable at `s`, writable at `d`, apart
            // (the contract).
            unsafe { std::ptr::copy_nonoverlapping(s, d, len) };
        }
        #[cfg(target_arch = "x86_64")]
        if streaming {
            // Order the streaming stores before whatever the caller does next.
            // SAFETY: SSE2 is part of x86_64.
            unsafe { std::arch::x86_64::_mm_sfence() };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = streaming; // no streaming stores elsewhere
    }

    /// Copy bytes `[from, to)` of the stream with `threads` threads, each a share of the bytes
    /// (cut at line multiples of the stream).
    ///
    /// # Safety
    /// The runs hold as [`copy_runs`] says.
    unsafe fn run(&self, from: usize, to: usize, threads: usize, streaming: bool) {
        let bytes = to.saturating_sub(from);
        let threads = threads.clamp(1, bytes.max(1));
        if threads == 1 {
            // SAFETY: bytes of the batch's runs, valid and apart (the contract), on this thread.
            return unsafe { self.copy_range(from, to, streaming) };
        }
        let share = bytes.div_ceil(threads).next_multiple_of(64);
        let cuts: Vec<(usize, usize)> = (0..threads)
            .map(|t| {
                let lo = from.saturating_add(share.saturating_mul(t)).min(to);
                (lo, lo.saturating_add(share).min(to))
            })
            .filter(|(lo, hi)| lo < hi)
            .collect();
        let Some((first, rest)) = cuts.split_first() else {
            return;
        };
        let shared = Shared(self);
        std::thread::scope(|scope| {
            let mut inline = Vec::new();
            for &(lo, hi) in rest {
                // SAFETY: a disjoint part of the batch's bytes (the contract); the scope joins
                // the thread before the call returns.
                let work = move || unsafe { shared.get().copy_range(lo, hi, streaming) };
                if std::thread::Builder::new()
                    .name("dlpack-copy".into())
                    .spawn_scoped(scope, work)
                    .is_err()
                {
                    inline.push((lo, hi)); // no thread to be had: do it here
                }
            }
            for (lo, hi) in std::iter::once(*first).chain(inline) {
                // SAFETY: a disjoint part of the batch's bytes (the contract).
                unsafe { self.copy_range(lo, hi, streaming) };
            }
        });
    }

    /// Whether bytes `[from, to)` of the stream have their destination all in memory or all
    /// not, and their source all in memory (`None`: not so); what can't be told counts as in
    /// memory.
    fn memory_of(&self, from: usize, to: usize) -> Option<Memory> {
        let (mut resident, mut fresh) = (false, false);
        for (run, at, len) in self.pieces(from, to) {
            let src = run.src as usize + at;
            if residency((src, src + len)).is_some_and(|(yes, all)| yes != all) {
                return None;
            }
            let dst = run.dst as usize + at;
            match residency((dst, dst + len)) {
                Some((0, _)) => fresh = true,
                Some((yes, all)) if yes != all => return None,
                _ => resident = true,
            }
        }
        match (resident, fresh) {
            (true, true) => None,
            (false, true) => Some(Memory::Fresh),
            _ => Some(Memory::Mapped),
        }
    }

    /// Measure the candidates on chunks of the stream, keep the choice, copy the rest with it
    /// (as the engine's calibration does for one copy: a chunk first, untimed, as the first
    /// candidate where there is room for it; rounds turning the candidates' order; slow ones
    /// pruned; rounds past the least stop at the cost budget). A batch that can't be cut into
    /// enough chunks, or whose chunks' memory differs from the key's, runs as the first
    /// candidate and leaves the measuring to a later copy.
    ///
    /// # Safety
    /// The runs hold as [`copy_runs`] says.
    unsafe fn calibrate(&self, cal: tune::Calibration<'_>, limits: &Limits) {
        let total = self.total;
        let k = cal.candidates.len();
        let most = cal.candidates.iter().map(|c| c.threads).max().unwrap_or(1);
        let first = cal.candidates.first().copied().unwrap_or(ONE_THREAD);
        let cut = limits
            .calibration_chunks(total, k, most)
            .and_then(|(rounds, chunk)| {
                let chunk = (chunk / 64 * 64).max(64);
                let timed = chunk.checked_mul(k * rounds)?;
                let lead = if timed.checked_add(chunk)? <= total {
                    chunk
                } else {
                    0
                };
                (lead + timed <= total && self.memory_of(0, lead + timed) == Some(cal.key.memory))
                    .then_some((rounds, chunk, lead))
            });
        let Some((rounds, chunk, lead)) = cut else {
            drop(cal);
            // SAFETY: all of the batch (the contract).
            return unsafe {
                self.run(0, total, limits.threads_for(total, first), first.streaming)
            };
        };
        let mut trials = vec![Vec::with_capacity(rounds); k];
        let mut measured = vec![0usize; k];
        let started = Instant::now();
        if lead > 0 {
            measured[0] = lead;
            // SAFETY: the stream's first `lead` bytes: a part of the batch.
            unsafe { self.run(0, lead, limits.threads_for(lead, first), first.streaming) };
        }
        let mut at = lead;
        for round in 0..rounds {
            if round >= tune::MIN_ROUNDS && tune::cost(&trials, &measured, None) > tune::COST_BUDGET
            {
                break;
            }
            // A batch's runs don't tell which of their threads waited for a core: only slow
            // candidates are pruned.
            let pruned = tune::pruned(&trials, &[]);
            for turn in 0..k {
                let c = (turn + round) % k;
                if pruned[c] {
                    continue;
                }
                let Choice { threads, streaming } = cal.candidates[c];
                let t = Instant::now();
                // SAFETY: bytes `at..at + chunk` of the stream, inside it (`cut`): a part of
                // the batch.
                unsafe { self.run(at, at + chunk, threads, streaming) };
                trials[c].push(t.elapsed().as_secs_f64() / chunk as f64);
                measured[c] += chunk;
                at += chunk;
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        let choice = cal.keep(&trials, &measured, total, seconds);
        let rest = total - at;
        if rest > 0 {
            let threads = limits.threads_for(rest, choice);
            // SAFETY: the stream's bytes from `at` on: the rest of the batch.
            unsafe { self.run(at, total, threads, choice.streaming) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::TINY;
    use super::super::tune::{Settings, Tuner};
    use super::*;
    use proptest::prelude::*;

    /// A tuner of its own with [`TINY`] limits: every batch is in a band and measures.
    fn measuring() -> Config {
        let tuner = super::super::tests::keep(Tuner::new(TINY, Settings::default(), 3));
        Config {
            tuner,
            ..Config::new()
        }
    }

    /// Copy runs of `lens` bytes (each at `skew` bytes past a line, `gap` bytes apart in the
    /// destination) with `config`; the destination must hold each run's bytes at its place
    /// and nothing else changed.
    fn check(lens: &[usize], skew: usize, gap: usize, config: Config) {
        let total: usize = lens.iter().sum();
        let src: Vec<u8> = (0..total + skew).map(|i| (i * 31 % 251) as u8).collect();
        let span = lens.iter().map(|n| n + gap).sum::<usize>() + 64;
        let mut dst = vec![0xeeu8; span];
        let mut expected = dst.clone();
        let mut runs = Vec::new();
        let (mut s, mut d) = (skew, skew % 64);
        for &len in lens {
            expected[d..d + len].copy_from_slice(&src[s..s + len]);
            runs.push(Run {
                dst: dst.as_mut_ptr().wrapping_add(d),
                src: src.as_ptr().wrapping_add(s),
                len,
            });
            s += len;
            d += len + gap;
        }
        // SAFETY: every run lies inside `src` and `dst`, which are apart, and the runs'
        // destinations are `gap` bytes apart, disjoint.
        unsafe { copy_runs_with(&runs, config) };
        assert!(dst == expected, "lens {lens:?} skew {skew} gap {gap}");
    }

    #[test]
    fn a_batch_copies_every_run_exactly() {
        let lens = [0, 1, 63, 64, 65, 4096, 0, 100_000, 3, 70_001];
        for config in [
            Config::new(),
            Config::fixed(1, false),
            Config::fixed(3, true),
        ] {
            for (skew, gap) in [(0, 0), (5, 0), (17, 64), (63, 1)] {
                check(&lens, skew, gap, config);
            }
        }
        check(&[], 0, 0, Config::fixed(3, true));
    }

    #[test]
    fn a_batch_measures_as_a_contiguous_copy_of_its_total_and_keeps_the_choice() {
        let config = measuring();
        let lens = vec![5000; 40];
        check(&lens, 3, 64, config);
        let log = config.tuner.log();
        assert_eq!(log.len(), 1, "{log:?}");
        assert_eq!(log[0].0.class, Class::Contiguous);
        // The next batch of the key uses what was kept.
        check(&lens, 0, 0, config);
        assert_eq!(config.tuner.log().len(), 1);
    }

    proptest! {
        #[test]
        fn any_batch_any_threads_copies_exactly(
            lens in prop::collection::vec(0usize..3000, 0..24),
            skew in 0usize..64,
            gap in 0usize..130,
            threads in 1usize..5,
            streaming: bool,
            measure: bool,
        ) {
            let config = if measure { measuring() } else { Config::fixed(threads, streaming) };
            check(&lens, skew, gap, config);
        }
    }
}
