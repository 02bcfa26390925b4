//! How the engine learns the machine it runs on: for each kind of copy ([`Class`]) and size
//! band ([`Band`]), the thread count and the store kind ([`Choice`]) are measured once per
//! process, on the first copy that can show them, and kept.
//!
//! Copies into memory not yet mapped (a fresh destination, whose pages the kernel maps, zeroed, as
//! the copy first writes them) are measured and kept apart from copies into memory already
//! written ([`Memory`]): the kernel's work weighs as much as the copy's there.
//!
//! A copy large enough to measure on is cut into a few chunks; each candidate copies some of
//! them, in turns (a round of every candidate, several rounds), and each keeps its fastest
//! chunk, in seconds per byte. [`decide`], a pure function of those times, keeps one thread
//! with ordinary stores unless another candidate beats it by more than [`MARGIN`]. Whatever the
//! candidates, the copy's bytes are the same: the chunks are disjoint parts of the one copy.
//!
//! On a machine busy with other work, measuring stays cheap ([`measure`]): it stops, in any
//! round, once it has cost [`COST_BUDGET`]; one thread's chunk counts its CPU time, and a
//! candidate whose threads waited for a core takes no more chunks ([`judge`]); and a chunk whose threads wait takes about as long as one thread
//! would (the engine's threads take pieces as they get to a core; the copy doesn't wait for a
//! thread that never did).
//!
//! `DLPACK_COPY_THREADS` (`auto` or a number) and `DLPACK_COPY_STORES` (`auto`, `regular` or
//! `streaming`) fix either or both ([`Settings`]); what they fix is not measured.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

/// Copies of at least this many bytes may use several threads and write with streaming
/// (non-temporal) stores, where measured faster; smaller ones never pay for starting threads.
pub const PARALLEL_THRESHOLD: usize = 4 << 20;
/// Copies of at least this many bytes are measured apart from smaller ones: those mostly run
/// in the caches, these mostly from and to memory.
pub const LARGE_THRESHOLD: usize = 16 << 20;
/// Each thread gets at least this many bytes of a copy.
pub(super) const MIN_BYTES_PER_THREAD: usize = 2 << 20;
/// The most threads the engine tries for one copy unless told otherwise.
const MAX_THREADS: usize = 8;
/// The most threads `DLPACK_COPY_THREADS` may ask for.
pub const MAX_THREADS_SETTING: usize = 256;

/// How much faster than the cheaper candidates (fewer threads, ordinary stores) another one must
/// be to be chosen: measurements on a shared machine scatter by a few percent.
pub const MARGIN: f64 = 0.10;
/// Rounds of the candidates a calibration's chunks have room for, at most and at least
/// (measuring may stop sooner: see [`measure`]).
const MAX_ROUNDS: usize = 4;
pub const MIN_ROUNDS: usize = 2;
/// A candidate whose fastest of [`MIN_ROUNDS`] chunks or more is this many times slower than
/// the fastest of all takes no more chunks: no margin could make it win. One chunk is not
/// enough to tell: one that waited for the machine's other work read 1.8 GB/s for streaming
/// stores that copy at 27. (A candidate whose threads waited for a core is told apart at once:
/// see [`waited`].)
pub const PRUNE: f64 = 2.0;
/// Seconds a calibration may lose against the fastest way before it stops, in any round (see
/// [`cost`]).
pub const COST_BUDGET: f64 = 5e-3;
/// The most bytes of a copy that calibration cuts into chunks: bounds its one-time cost.
const CALIBRATION_MAX_BYTES: usize = 48 << 20;
/// The bytes of a calibration chunk where the copy has room for [`MIN_ROUNDS`] rounds of them:
/// well past the nearest caches, so that what the chunk before left in them (dirty lines of
/// ordinary stores, written back meanwhile) weighs little. Smaller chunks misjudged
/// (a 4096x4096 `f32` transpose in 1 MiB chunks: streaming stores measured at 8 GB/s, where the
/// copy runs at 27).
const CALIBRATION_CHUNK_BYTES: usize = 4 << 20;
/// The fewest bytes a thread gets in a calibration chunk: less, and starting it weighs more
/// than its share of the copy.
const CALIBRATION_MIN_BYTES_PER_THREAD: usize = 256 << 10;

/// What a copy's inner loops do, which decides how it uses memory and cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// Runs contiguous on both sides: `memcpy`.
    Contiguous,
    /// Transposing tiles.
    Tiles,
    /// Element by element along rows strided on one side or both (gathers, scatters, reversals,
    /// broadcasts).
    Gather,
    /// Any copy that swaps bytes.
    Swap,
}

impl Class {
    pub const ALL: [Class; 4] = [Class::Contiguous, Class::Tiles, Class::Gather, Class::Swap];

    pub fn name(self) -> &'static str {
        match self {
            Class::Contiguous => "contiguous",
            Class::Tiles => "transpose",
            Class::Gather => "gather",
            Class::Swap => "byte swap",
        }
    }

    /// Whether its kernels can write with streaming stores (those of x86-64): all but the byte
    /// swaps' (gathers, where the destination's rows are contiguous).
    pub fn has_streaming(self) -> bool {
        cfg!(target_arch = "x86_64") && self != Class::Swap
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The copy sizes a choice holds for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Band {
    /// From [`PARALLEL_THRESHOLD`] to [`LARGE_THRESHOLD`].
    Mid,
    /// From [`LARGE_THRESHOLD`] up.
    Large,
}

impl Band {
    pub const ALL: [Band; 2] = [Band::Mid, Band::Large];

    /// The band of a copy of `bytes` under `limits`; `None` below the parallel threshold, where
    /// a copy is always one thread with ordinary stores.
    pub fn of(bytes: usize, limits: &Limits) -> Option<Band> {
        if bytes < limits.parallel {
            None
        } else if bytes < limits.large {
            Some(Band::Mid)
        } else {
            Some(Band::Large)
        }
    }

    /// The sizes the band holds, `[low, high)` (`None`: no end).
    pub fn bytes(self, limits: &Limits) -> (usize, Option<usize>) {
        match self {
            Band::Mid => (limits.parallel, Some(limits.large)),
            Band::Large => (limits.large, None),
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Whether a copy's destination is in memory yet: which of two sets of choices it uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Memory {
    /// Written before (mapped): the copy's own speed.
    Mapped,
    /// Not mapped yet (fresh from the allocator): each page is mapped, zeroed, on its first
    /// write.
    Fresh,
}

impl Memory {
    pub const ALL: [Memory; 2] = [Memory::Mapped, Memory::Fresh];

    fn index(self) -> usize {
        self as usize
    }
}

/// How a copy runs: at most `threads` threads (each with at least `MIN_BYTES_PER_THREAD`),
/// and whether kernels that can write with streaming stores do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Choice {
    pub threads: usize,
    pub streaming: bool,
}

/// One thread, ordinary stores: what every copy below [`PARALLEL_THRESHOLD`] does, and what
/// a measured choice must beat.
pub const ONE_THREAD: Choice = Choice {
    threads: 1,
    streaming: false,
};

/// What the environment fixes (`None`: measured).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    pub threads: Option<usize>,
    pub streaming: Option<bool>,
}

/// The variable that fixes the thread count.
pub const THREADS_VAR: &str = "DLPACK_COPY_THREADS";
/// The variable that fixes the store kind.
pub const STORES_VAR: &str = "DLPACK_COPY_STORES";

impl Settings {
    /// Parse the two variables' values (`None`: unset). An empty value is `auto`.
    pub fn parse(threads: Option<&str>, stores: Option<&str>) -> Result<Settings, String> {
        let threads = match threads.map(str::trim) {
            None | Some("") => None,
            Some(t) if t.eq_ignore_ascii_case("auto") => None,
            Some(t) => match t.parse::<usize>() {
                Ok(n) if (1..=MAX_THREADS_SETTING).contains(&n) => Some(n),
                _ => {
                    return Err(format!(
                        "{THREADS_VAR}={t:?} is not understood: give 'auto' (measure, the \
                         default) or a whole number of threads from 1 to {MAX_THREADS_SETTING}"
                    ));
                }
            },
        };
        let streaming = match stores.map(str::trim) {
            None | Some("") => None,
            Some(s) if s.eq_ignore_ascii_case("auto") => None,
            Some(s) if s.eq_ignore_ascii_case("regular") => Some(false),
            Some(s) if s.eq_ignore_ascii_case("streaming") => Some(true),
            Some(s) => {
                return Err(format!(
                    "{STORES_VAR}={s:?} is not understood: give 'auto' (measure, the default), \
                     'regular' or 'streaming'"
                ));
            }
        };
        Ok(Settings { threads, streaming })
    }

    /// The process's settings, read from the environment once. An error says which variable
    /// holds what can't be understood; the engine then measures as if neither were set (the
    /// Python extension refuses to load instead).
    pub fn from_env() -> &'static Result<Settings, String> {
        static SETTINGS: OnceLock<Result<Settings, String>> = OnceLock::new();
        SETTINGS.get_or_init(|| {
            let var = |name| std::env::var(name).ok();
            Settings::parse(var(THREADS_VAR).as_deref(), var(STORES_VAR).as_deref())
        })
    }
}

/// The threads a machine offers the engine: the CPUs this process may run on, at most
/// `MAX_THREADS` (8).
pub fn available_threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_THREADS)
    })
}

/// The candidates for a class, the cheapest first (fewer threads, then ordinary stores before
/// streaming ones): `max_threads` threads, half as many where that is 4 or more, and one;
/// streaming stores too for classes whose kernels have them. What `settings` fix is the only
/// value tried.
pub fn candidates(class: Class, settings: Settings, max_threads: usize) -> Vec<Choice> {
    let threads: Vec<usize> = match settings.threads {
        Some(n) => vec![n],
        None => {
            let max = max_threads.max(1);
            let mut t = vec![1, max / 2, max];
            t.retain(|&n| n >= 1 && (n == 1 || n == max || max >= 4));
            t.dedup();
            t
        }
    };
    let can_stream = class.has_streaming();
    let stores: Vec<bool> = match settings.streaming {
        Some(s) => vec![s && can_stream],
        None if can_stream => vec![false, true],
        None => vec![false],
    };
    let mut out = Vec::new();
    for &threads in &threads {
        for &streaming in &stores {
            out.push(Choice { threads, streaming });
        }
    }
    out
}

/// A candidate's fastest finite, positive time; `None` when it has none.
pub fn fastest(times: &[f64]) -> Option<f64> {
    times
        .iter()
        .copied()
        .filter(|t| t.is_finite() && *t > 0.0)
        .reduce(f64::min)
}

/// The candidate to keep, by index into `trials` (each candidate's times per byte, the cheapest
/// candidate first). The first (one thread, ordinary stores, when nothing is fixed) stays unless
/// the fastest beats it by more than [`MARGIN`]; otherwise the cheapest of those that beat the
/// first by more than the margin and are within it of the fastest. Only each candidate's fastest
/// time counts (noise only slows a trial down); a candidate without one can't be picked, and
/// the first stays when it has none to compare with.
pub fn decide(trials: &[Vec<f64>]) -> usize {
    let best: Vec<Option<f64>> = trials.iter().map(|t| fastest(t)).collect();
    let Some(&Some(first)) = best.first() else {
        return 0;
    };
    let top = best.iter().flatten().copied().fold(first, f64::min);
    if first <= top * (1.0 + MARGIN) {
        return 0;
    }
    best.iter()
        .position(|b| b.is_some_and(|b| b <= top * (1.0 + MARGIN) && b * (1.0 + MARGIN) < first))
        .unwrap_or(0)
}

/// Whether a chunk run by `threads` threads, cut into `pieces` pieces of which threads other
/// than the caller's ran `by_others`, had threads waiting for a core: the others ran less than
/// half their share (each thread takes pieces as it gets to them, so one that doesn't start
/// leaves its share to the rest). Its time is then the caller's thread's, not the candidate's,
/// and on a machine that busy, extra threads wait in any copy.
pub fn waited(threads: usize, pieces: usize, by_others: usize) -> bool {
    let others = threads.saturating_sub(1).min(pieces.saturating_sub(1));
    others > 0 && by_others.saturating_mul(2 * threads) < pieces.saturating_mul(others)
}

/// What a calibration chunk measured: the threads its candidate runs, the wall-clock seconds it
/// took, the CPU seconds the caller's thread spent in it (`None`: can't be told here), and how
/// its pieces were shared ([`waited`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Chunk {
    pub threads: usize,
    pub wall: f64,
    pub cpu: Option<f64>,
    pub pieces: usize,
    pub by_others: usize,
}

/// A chunk's seconds, and whether its threads waited for a core. A chunk on the caller's thread
/// alone counts its CPU time, when there is one and no longer than the wall time: the copy's
/// own (memory stalls and page faults included), without the time the machine's other work held
/// the core. A chunk of several threads counts its wall time, and waited when the others ran
/// less than their share ([`waited`]) or the caller's thread ran less than half the time: its
/// time is then not the candidate's, and on a machine that busy extra threads wait in any copy.
/// Only ever favours the one thread the others are measured against.
pub fn judge(chunk: Chunk) -> (f64, bool) {
    let Chunk {
        threads,
        wall,
        cpu,
        pieces,
        by_others,
    } = chunk;
    if threads <= 1 || pieces <= 1 {
        let own = cpu.filter(|&c| c > 0.0 && c <= wall);
        return (own.unwrap_or(wall), false);
    }
    let held = cpu.is_some_and(|c| c.is_nan() || c < 0.5 * wall);
    (wall, held || waited(threads, pieces, by_others))
}

/// Which candidates take no more chunks: never the first, which the others are measured
/// against, nor the fastest so far, nor the one [`decide`] would pick; one whose threads waited for a core (`waited`, per
/// candidate: in any of its chunks, see [`waited`]) at once, and one with [`MIN_ROUNDS`] times
/// or more that is [`PRUNE`] times slower than the fastest.
pub fn pruned(trials: &[Vec<f64>], waited: &[bool]) -> Vec<bool> {
    let best: Vec<Option<f64>> = trials.iter().map(|t| fastest(t)).collect();
    let top = best.iter().flatten().copied().reduce(f64::min);
    let pick = decide(trials);
    (trials.iter().zip(&best).enumerate())
        .map(|(i, (t, b))| {
            let fastest = top.is_some_and(|top| b.is_some_and(|b| b <= top));
            let slow = top.is_some_and(|top| b.is_some_and(|b| b > PRUNE * top));
            let waited = waited.get(i).copied().unwrap_or(false);
            i > 0 && i != pick && !fastest && (waited || (t.len() >= MIN_ROUNDS && slow))
        })
        .collect()
}

/// Whether measuring has cost more than `budget` seconds ([`cost`] against the fastest; the
/// engine's is [`COST_BUDGET`]): no more chunks are measured then, whatever the round.
pub fn over_budget(trials: &[Vec<f64>], bytes: &[usize], budget: f64) -> bool {
    cost(trials, bytes, None) > budget
}

/// A calibration's rounds: `rounds` rounds of every candidate (`trials.len()` of them), each
/// starting one further along so that none always follows another, with the first candidate
/// first; `chunk(c)` copies a chunk as candidate `c` and returns its seconds per byte, its
/// bytes and whether its threads waited for a core ([`waited`]). Before each chunk, measuring
/// stops once it is [`over_budget`] (`budget` seconds), and candidates [`pruned`] take no more chunks: on a
/// loaded machine those are most of the cost. `trials` and `bytes` hold each candidate's times
/// and bytes (the first's may hold untimed bytes already); `chunk` is called at most `rounds`
/// times per candidate.
pub fn measure(
    trials: &mut [Vec<f64>],
    bytes: &mut [usize],
    rounds: usize,
    budget: f64,
    mut chunk: impl FnMut(usize) -> (f64, usize, bool),
) {
    let k = trials.len().min(bytes.len());
    let mut waits = vec![false; k];
    for round in 0..rounds {
        for turn in 0..k {
            if over_budget(trials, bytes, budget) {
                return;
            }
            let c = (turn + round) % k;
            if pruned(trials, &waits)[c] {
                continue;
            }
            let (per_byte, n, waited) = chunk(c);
            trials[c].push(per_byte);
            bytes[c] = bytes[c].saturating_add(n);
            waits[c] |= waited;
        }
    }
}

/// What measuring has cost: each candidate's bytes at its fastest rate, less the same bytes at
/// the rate of candidate `against` (`None`: the fastest); per candidate, `trials` holds seconds
/// per byte of each chunk and `bytes` the bytes of its chunks. Rates are the fastest chunks':
/// a chunk that waited for the machine's other work would have waited as long without the
/// measuring.
pub fn cost(trials: &[Vec<f64>], bytes: &[usize], against: Option<usize>) -> f64 {
    let best: Vec<Option<f64>> = trials.iter().map(|t| fastest(t)).collect();
    let base = match against {
        Some(c) => best.get(c).copied().flatten(),
        None => best.iter().flatten().copied().reduce(f64::min),
    };
    let Some(base) = base else {
        return 0.0;
    };
    (best.iter().zip(bytes))
        .map(|(b, &n)| b.map_or(0.0, |b| ((b - base) * n as f64).max(0.0)))
        .sum()
}

/// How a choice was made.
#[derive(Clone, Debug, PartialEq)]
pub enum How {
    /// The settings leave one candidate.
    Fixed,
    /// Measured on a copy.
    Measured(Measurement),
}

/// A calibration's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Measurement {
    /// The candidates and each one's fastest chunk in seconds per byte (`None`: no time).
    pub candidates: Vec<(Choice, Option<f64>)>,
    /// Bytes of the copy measured on, and of it the calibration's: its chunks and the untimed
    /// ones before them, which the first candidate copies.
    pub copy_bytes: usize,
    pub calibrated_bytes: usize,
    /// Seconds those took, and the calibration's one-time cost ([`cost`] against the chosen
    /// candidate).
    pub seconds: f64,
    pub cost_seconds: f64,
}

/// A kept choice.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub choice: Choice,
    pub how: How,
}

/// Sizes the engine works with; [`Limits::DEFAULT`] but in tests, which calibrate on small
/// copies.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub parallel: usize,
    pub large: usize,
    pub min_bytes_per_thread: usize,
    pub calibration_max_bytes: usize,
    pub calibration_chunk_bytes: usize,
    pub calibration_min_bytes_per_thread: usize,
    /// Seconds measuring may cost ([`COST_BUDGET`]; tests that count the chunks lift it).
    pub cost_budget: f64,
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        parallel: PARALLEL_THRESHOLD,
        large: LARGE_THRESHOLD,
        min_bytes_per_thread: MIN_BYTES_PER_THREAD,
        calibration_max_bytes: CALIBRATION_MAX_BYTES,
        calibration_chunk_bytes: CALIBRATION_CHUNK_BYTES,
        calibration_min_bytes_per_thread: CALIBRATION_MIN_BYTES_PER_THREAD,
        cost_budget: COST_BUDGET,
    };

    /// Threads for a copy of `bytes` under `choice`: one below the parallel threshold, else
    /// as many as give each at least its share, at most `choice.threads`.
    pub fn threads_for(&self, bytes: usize, choice: Choice) -> usize {
        if bytes < self.parallel {
            return 1;
        }
        (bytes / self.min_bytes_per_thread.max(1)).clamp(1, choice.threads.max(1))
    }

    /// How to cut a copy of `bytes` for calibrating `k` candidates (`max_threads` at most):
    /// (rounds, bytes per chunk). Chunks of the target size, as many rounds of them as the copy
    /// (and the calibration's byte bound) holds, up to `MAX_ROUNDS`; where that is fewer than
    /// `MIN_ROUNDS`, that many rounds of smaller chunks; `None` when those would give a thread
    /// less than its least share.
    pub fn calibration_chunks(
        &self,
        bytes: usize,
        k: usize,
        max_threads: usize,
    ) -> Option<(usize, usize)> {
        let least = self
            .calibration_min_bytes_per_thread
            .saturating_mul(max_threads.max(1))
            .max(1);
        let (k, bound) = (k.max(1), bytes.min(self.calibration_max_bytes));
        let target = self.calibration_chunk_bytes.max(least);
        let rounds = (bound / k / target).min(MAX_ROUNDS);
        if rounds >= MIN_ROUNDS {
            return Some((rounds, target));
        }
        let chunk = bound / (k * MIN_ROUNDS);
        (chunk >= least).then_some((MIN_ROUNDS, chunk))
    }
}

/// What a kept choice holds for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub class: Class,
    pub band: Band,
    pub memory: Memory,
}

impl Key {
    /// Every key, in the report's order.
    pub fn all() -> impl Iterator<Item = Key> {
        (Class::ALL.into_iter()).flat_map(|class| {
            (Band::ALL.into_iter()).flat_map(move |band| {
                (Memory::ALL.into_iter()).map(move |memory| Key {
                    class,
                    band,
                    memory,
                })
            })
        })
    }
}

/// What [`Tuner::lookup`] found.
pub enum Lookup<'a> {
    /// Use this.
    Known(Choice),
    /// Nothing kept yet, and this caller measures: [`Calibration::keep`] the result (dropping
    /// the guard unkept lets a later copy measure).
    Measure(Calibration<'a>),
}

/// One slot of the table: 0 unmeasured, 1 being measured, 2 kept.
#[derive(Default)]
struct Slot {
    state: AtomicU8,
    record: OnceLock<Record>,
}

const UNMEASURED: u8 = 0;
const MEASURING: u8 = 1;

/// The kept choices, per class and band.
pub struct Tuner {
    slots: [[[Slot; 2]; 2]; 4],
    pub limits: Limits,
    pub settings: Settings,
    pub max_threads: usize,
    /// A test hook: what every calibration of this tuner recorded, in order.
    log: Mutex<Vec<(Key, Record)>>,
}

impl Tuner {
    pub fn new(limits: Limits, settings: Settings, max_threads: usize) -> Tuner {
        Tuner {
            slots: Default::default(),
            limits,
            settings,
            max_threads,
            log: Mutex::new(Vec::new()),
        }
    }

    /// The process's tuner: the environment's settings (as if unset when they can't be
    /// understood) and the machine's threads.
    pub fn process() -> &'static Tuner {
        static TUNER: OnceLock<Tuner> = OnceLock::new();
        TUNER.get_or_init(|| {
            let settings = Settings::from_env().clone().unwrap_or_default();
            Tuner::new(Limits::DEFAULT, settings, available_threads())
        })
    }

    fn slot(&self, key: Key) -> &Slot {
        &self.slots[key.class.index()][key.band.index()][key.memory.index()]
    }

    /// The candidates for `class` here.
    pub fn candidates(&self, class: Class) -> Vec<Choice> {
        candidates(class, self.settings, self.max_threads)
    }

    /// The choice for a copy of `key`: the kept one; the only candidate when the settings
    /// leave one (kept at once); the first (cheapest) candidate while another copy measures;
    /// else the caller measures.
    pub fn lookup(&self, key: Key) -> Lookup<'_> {
        let slot = self.slot(key);
        if let Some(r) = slot.record.get() {
            return Lookup::Known(r.choice);
        }
        let candidates = self.candidates(key.class);
        if let [only] = candidates[..] {
            let record = Record {
                choice: only,
                how: How::Fixed,
            };
            return Lookup::Known(slot.record.get_or_init(|| record).choice);
        }
        match slot.state.compare_exchange(
            UNMEASURED,
            MEASURING,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Lookup::Measure(Calibration {
                tuner: self,
                key,
                candidates,
            }),
            Err(_) => Lookup::Known(slot.record.get().map_or(candidates[0], |r| r.choice)),
        }
    }

    /// What is kept for `key`, if anything.
    pub fn record(&self, key: Key) -> Option<Record> {
        self.slot(key).record.get().cloned()
    }

    /// Every calibration this tuner kept, in order.
    pub fn log(&self) -> Vec<(Key, Record)> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The right to measure one key (see [`Lookup::Measure`]).
pub struct Calibration<'a> {
    tuner: &'a Tuner,
    pub key: Key,
    pub candidates: Vec<Choice>,
}

impl Calibration<'_> {
    /// Keep the candidate [`decide`] picks from `trials` (per candidate, seconds per byte of
    /// each timed chunk; `bytes`, what it copied, untimed bytes too), measured on `copy_bytes`
    /// bytes in `seconds`; returns the choice.
    pub fn keep(
        self,
        trials: &[Vec<f64>],
        bytes: &[usize],
        copy_bytes: usize,
        seconds: f64,
    ) -> Choice {
        let pick = decide(trials);
        let choice = self.candidates.get(pick).copied().unwrap_or(ONE_THREAD);
        let best: Vec<Option<f64>> = trials.iter().map(|t| fastest(t)).collect();
        let measurement = Measurement {
            candidates: self.candidates.iter().copied().zip(best).collect(),
            copy_bytes,
            calibrated_bytes: bytes.iter().sum(),
            seconds,
            cost_seconds: cost(trials, bytes, Some(pick)),
        };
        let record = Record {
            choice,
            how: How::Measured(measurement),
        };
        let slot = self.tuner.slot(self.key);
        let kept = slot.record.get_or_init(|| record).clone();
        (self.tuner.log.lock())
            .unwrap_or_else(PoisonError::into_inner)
            .push((self.key, kept.clone()));
        kept.choice
    }
}

impl Drop for Calibration<'_> {
    fn drop(&mut self) {
        let slot = self.tuner.slot(self.key);
        if slot.record.get().is_none() {
            slot.state.store(UNMEASURED, Ordering::Release);
        }
    }
}

/// One key of [`report`].
#[derive(Clone, Debug)]
pub struct Entry {
    pub key: Key,
    /// The sizes it covers, `[low, high)` (`None`: no end).
    pub bytes: (usize, Option<usize>),
    pub candidates: Vec<Choice>,
    /// What is kept; `None`: nothing yet (no copy of it large enough has run).
    pub record: Option<Record>,
}

/// What the process's engine has chosen, and from what.
#[derive(Clone, Debug)]
pub struct Report {
    /// The environment's settings, or why they can't be understood (then ignored).
    pub settings: Result<Settings, String>,
    /// The most threads a copy is offered when the thread count is measured.
    pub max_threads: usize,
    pub entries: Vec<Entry>,
}

/// The process's choices so far.
pub fn report() -> Report {
    let tuner = Tuner::process();
    let entries = Key::all()
        .map(|key| {
            let candidates = tuner.candidates(key.class);
            // What the settings fix is kept on a copy's first look; it holds before that too.
            let fixed = match candidates[..] {
                [only] => Some(Record {
                    choice: only,
                    how: How::Fixed,
                }),
                _ => None,
            };
            Entry {
                key,
                bytes: key.band.bytes(&tuner.limits),
                record: tuner.record(key).or(fixed),
                candidates,
            }
        })
        .collect();
    Report {
        settings: Settings::from_env().clone(),
        max_threads: tuner.max_threads,
        entries,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Made-up times: per candidate, a few trials, some of them missing or nonsense.
    fn trials() -> impl Strategy<Value = Vec<Vec<f64>>> {
        let time = prop_oneof![
            8 => 1e-12f64..1e-8,
            1 => Just(f64::INFINITY),
            1 => Just(f64::NAN),
            1 => Just(0.0),
            1 => Just(-1e-9),
        ];
        proptest::collection::vec(proptest::collection::vec(time, 0..4), 1..7)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The pick is a candidate; the first (one thread, ordinary stores) unless the fastest
        /// beats it by more than the margin; else one that beats it by more than the margin,
        /// within the margin of the fastest, and no cheaper candidate is both.
        #[test]
        fn decide_keeps_its_promises(t in trials()) {
            let pick = decide(&t);
            prop_assert!(pick < t.len());
            let best: Vec<Option<f64>> = t.iter().map(|x| fastest(x)).collect();
            let Some(first) = best[0] else {
                prop_assert_eq!(pick, 0);
                return Ok(());
            };
            let top = best.iter().flatten().copied().fold(f64::INFINITY, f64::min);
            let near_top = |b: f64| b <= top * (1.0 + MARGIN);
            let beats_first = |b: f64| b * (1.0 + MARGIN) < first;
            if near_top(first) {
                prop_assert_eq!(pick, 0);
                return Ok(());
            }
            let chosen = best[pick].expect("a measured candidate");
            prop_assert!(near_top(chosen) && beats_first(chosen));
            for cheaper in best[..pick].iter().flatten() {
                prop_assert!(!(near_top(*cheaper) && beats_first(*cheaper)));
            }
        }

        /// Only each candidate's fastest trial counts: the same pick whatever the units, the
        /// order of the trials, or slower trials added.
        #[test]
        fn decide_depends_on_fastest_trials_alone(
            t in trials(),
            scale in prop_oneof![Just(1e-3), Just(2.0), Just(1e6)],
            extra in 1.0f64..10.0,
        ) {
            let pick = decide(&t);
            let scaled: Vec<Vec<f64>> =
                t.iter().map(|x| x.iter().map(|v| v * scale).collect()).collect();
            // Scaling can move a time across the margin only by rounding: skip those.
            let near = |v: &[Vec<f64>]| {
                let best: Vec<f64> = v.iter().filter_map(|x| fastest(x)).collect();
                let top = best.iter().copied().fold(f64::INFINITY, f64::min);
                let first = v.first().and_then(|x| fastest(x)).unwrap_or(f64::NAN);
                let close = |x: f64, y: f64| (x / y - 1.0).abs() < 1e-9;
                best.iter().any(|&b| {
                    close(b, top * (1.0 + MARGIN)) || close(b * (1.0 + MARGIN), first)
                })
            };
            if !near(&t) {
                prop_assert_eq!(decide(&scaled), pick);
            }
            let reversed: Vec<Vec<f64>> =
                t.iter().map(|x| x.iter().rev().copied().collect()).collect();
            prop_assert_eq!(decide(&reversed), pick);
            let slower: Vec<Vec<f64>> = t
                .iter()
                .map(|x| {
                    let mut x = x.clone();
                    if let Some(b) = fastest(&x) {
                        x.push(b * extra);
                    }
                    x
                })
                .collect();
            prop_assert_eq!(decide(&slower), pick);
        }

        /// A candidate clearly fastest (by more than the margin over every other) is picked.
        #[test]
        fn decide_picks_a_clear_winner(
            n in 2usize..7,
            winner in 0usize..7,
            base in 1e-11f64..1e-9,
            others in proptest::collection::vec(1.0f64..5.0, 7),
            gain in 1.2f64..4.0,
        ) {
            let winner = winner % n;
            let t: Vec<Vec<f64>> = (0..n)
                .map(|i| {
                    let v = if i == winner { base } else { base * gain * others[i] };
                    vec![v * 1.5, v, v * 1.1]
                })
                .collect();
            prop_assert_eq!(decide(&t), winner);
        }

        /// The candidates: the cheapest first, one thread with ordinary stores first when
        /// nothing is fixed, what is fixed the only value, streaming only where it exists.
        #[test]
        fn candidates_follow_the_settings(
            threads in proptest::option::of(1usize..=MAX_THREADS_SETTING),
            streaming in proptest::option::of(any::<bool>()),
            max in 1usize..=MAX_THREADS,
            class in proptest::sample::select(Class::ALL.to_vec()),
        ) {
            let settings = Settings { threads, streaming };
            let c = candidates(class, settings, max);
            prop_assert!(!c.is_empty());
            let can_stream = class.has_streaming();
            for w in c.windows(2) {
                prop_assert!((w[0].threads, w[0].streaming) < (w[1].threads, w[1].streaming));
            }
            for x in &c {
                prop_assert!(!x.streaming || can_stream);
                prop_assert!(x.threads >= 1 && x.threads <= threads.unwrap_or(max));
                if let Some(n) = threads {
                    prop_assert_eq!(x.threads, n);
                }
                if let Some(s) = streaming {
                    prop_assert_eq!(x.streaming, s && can_stream);
                }
            }
            if threads.is_none() && streaming.is_none() {
                prop_assert_eq!(c[0], ONE_THREAD);
                prop_assert!(c.iter().any(|x| x.threads == max));
                prop_assert_eq!(c.iter().any(|x| x.streaming), can_stream);
            }
        }

        /// Calibration chunks: within the byte bound, each thread its least share, whole
        /// rounds inside the copy.
        #[test]
        fn calibration_chunks_fit(bytes in 0usize..(1 << 34), k in 1usize..7, max in 1usize..=8) {
            let l = Limits::DEFAULT;
            match l.calibration_chunks(bytes, k, max) {
                Some((rounds, chunk)) => {
                    prop_assert!((MIN_ROUNDS..=MAX_ROUNDS).contains(&rounds));
                    prop_assert!(rounds * k * chunk <= bytes.min(l.calibration_max_bytes));
                    prop_assert!(chunk >= l.calibration_min_bytes_per_thread * max);
                    // the target size where there is room for the least rounds of it
                    let room = bytes.min(l.calibration_max_bytes) / (k * MIN_ROUNDS);
                    prop_assert_eq!(chunk == l.calibration_chunk_bytes, room >= l.calibration_chunk_bytes);
                }
                None => {
                    let least = l.calibration_min_bytes_per_thread * max;
                    let fit = bytes.min(l.calibration_max_bytes) / (MIN_ROUNDS * k);
                    prop_assert!(fit < least);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// A copy below the parallel threshold has no band (nothing measured or kept applies:
        /// one thread, ordinary stores) and takes one thread whatever the choice; above it,
        /// every thread gets its least share, and no more threads than the choice's.
        #[test]
        fn small_copies_take_one_thread(
            bytes in prop_oneof![0usize..(64 << 20), any::<usize>()],
            threads in 0usize..=MAX_THREADS_SETTING,
            streaming in any::<bool>(),
        ) {
            let l = Limits::DEFAULT;
            let t = l.threads_for(bytes, Choice { threads, streaming });
            prop_assert!(t >= 1 && t <= threads.max(1));
            if bytes < l.parallel {
                prop_assert_eq!(t, 1);
                prop_assert_eq!(Band::of(bytes, &l), None);
            } else {
                prop_assert!(Band::of(bytes, &l).is_some());
            }
            if t > 1 {
                prop_assert!(bytes / t >= l.min_bytes_per_thread);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Pruning never drops the first candidate or the fastest (nor so `decide`'s pick), and
        /// drops only candidates whose threads waited or, with `MIN_ROUNDS` times, far slower.
        #[test]
        fn pruning_drops_only_losers(
            t in trials(),
            w in proptest::collection::vec(any::<bool>(), 7),
        ) {
            let w = &w[..t.len()];
            let p = pruned(&t, w);
            prop_assert_eq!(p.len(), t.len());
            prop_assert!(!p[0]);
            let pick = decide(&t);
            prop_assert!(!p[pick]);
            let best: Vec<Option<f64>> = t.iter().map(|x| fastest(x)).collect();
            let top = best.iter().flatten().copied().reduce(f64::min);
            for (i, &dropped) in p.iter().enumerate() {
                if best[i].is_some() && best[i] == top {
                    prop_assert!(!dropped);
                }
                if dropped && !w[i] {
                    prop_assert!(best[i].unwrap() > PRUNE * top.unwrap());
                    prop_assert!(t[i].len() >= MIN_ROUNDS);
                }
                if i > 0 && i != pick && w[i] && best[i] != top {
                    prop_assert!(dropped);
                }
            }
        }

        /// The rounds, on made-up chunks (each candidate's time per byte with noise, threads
        /// that wait at random): no chunk starts once measuring is over its budget, so what it
        /// costs is the budget and one chunk at most; the first candidate is measured first;
        /// none gets more than `rounds` chunks; one whose threads waited gets no more unless it
        /// is the fastest; and `decide` picks the first or one past it by the margin.
        #[test]
        fn measuring_keeps_its_budget(
            rates in proptest::collection::vec(1e-11f64..5e-9, 1..7),
            noise in proptest::collection::vec(1.0f64..20.0, 28),
            waits in proptest::collection::vec(proptest::bool::weighted(0.3), 28),
            rounds in 1usize..=MAX_ROUNDS,
            chunk_bytes in (256usize << 10)..(8 << 20),
            warm in 0usize..(1 << 20),
        ) {
            let k = rates.len();
            let mut trials = vec![Vec::new(); k];
            let mut bytes = vec![0; k];
            bytes[0] = warm;
            let mut seen = (vec![Vec::<f64>::new(); k], bytes.clone(), vec![false; k]);
            let mut calls = 0;
            let mut order = Vec::new();
            // Per chunk: whether it started over the budget, or pruned.
            let mut broken = Vec::new();
            measure(&mut trials, &mut bytes, rounds, COST_BUDGET, |c| {
                let (t, b, w) = &mut seen;
                broken.push(over_budget(t, b, COST_BUDGET) || pruned(t, w)[c]);
                let per_byte = rates[c] * noise[calls % noise.len()];
                let waited = c > 0 && waits[calls % waits.len()];
                calls += 1;
                order.push(c);
                t[c].push(per_byte);
                b[c] += chunk_bytes;
                w[c] |= waited;
                (per_byte, chunk_bytes, waited)
            });
            prop_assert!(!broken.contains(&true), "a chunk started over the budget or pruned");
            prop_assert_eq!(order.first().copied(), Some(0));
            prop_assert_eq!(&trials, &seen.0);
            prop_assert_eq!(&bytes, &seen.1);
            prop_assert!(trials.iter().all(|t| t.len() <= rounds));
            // Less the last chunk, the cost is within the budget.
            let last = *order.last().unwrap();
            let mut before = trials.clone();
            before[last].pop();
            let mut before_bytes = bytes.clone();
            before_bytes[last] -= chunk_bytes;
            prop_assert!(!over_budget(&before, &before_bytes, COST_BUDGET));
            let pick = decide(&trials);
            if pick != 0 {
                let first = fastest(&trials[0]).unwrap();
                prop_assert!(fastest(&trials[pick]).unwrap() * (1.0 + MARGIN) < first);
            }
        }
    }

    proptest! {
        /// A chunk's seconds are never more than its wall time, never less than the caller's
        /// CPU time where that is one; several threads always count the wall's.
        #[test]
        fn judge_never_favours_threads(
            threads in 1usize..9,
            wall in 1e-6f64..1.0,
            cpu in proptest::option::of(prop_oneof![0.0f64..2.0, Just(f64::NAN)]),
            pieces in 0usize..40,
            by_others in 0usize..40,
        ) {
            let chunk = Chunk { threads, wall, cpu, pieces, by_others: by_others.min(pieces) };
            let (seconds, waited) = judge(chunk);
            prop_assert!(seconds > 0.0 && seconds <= wall);
            if threads > 1 && pieces > 1 {
                prop_assert_eq!(seconds, wall);
            } else {
                prop_assert!(!waited);
                if let Some(c) = cpu.filter(|&c| c > 0.0 && c <= wall) {
                    prop_assert_eq!(seconds, c);
                }
            }
        }
    }

    #[test]
    fn waited_by_hand() {
        // Two threads, 8 pieces: the other thread ran none, 1 (less than half its 4), 2, 4.
        assert!(waited(2, 8, 0));
        assert!(waited(2, 8, 1));
        assert!(!waited(2, 8, 2));
        assert!(!waited(2, 8, 4));
        // Four threads, 16 pieces: the three others' share is 12; half of it is 6.
        assert!(waited(4, 16, 5));
        assert!(!waited(4, 16, 6));
        // One thread, or one piece: no other thread to wait for.
        assert!(!waited(1, 4, 0));
        assert!(!waited(2, 1, 0));
        assert!(!waited(0, 0, 0));
    }

    #[test]
    fn judge_by_hand() {
        let c = |threads, wall, cpu, pieces, by_others| Chunk {
            threads,
            wall,
            cpu,
            pieces,
            by_others,
        };
        // One thread, held off its core half the time: its CPU time counts.
        assert_eq!(judge(c(1, 2e-3, Some(1e-3), 1, 0)), (1e-3, false));
        // No CPU time, or one that can't be (longer than the wall, zero, NaN): the wall's.
        assert_eq!(judge(c(1, 2e-3, None, 1, 0)), (2e-3, false));
        assert_eq!(judge(c(1, 2e-3, Some(3e-3), 1, 0)), (2e-3, false));
        assert_eq!(judge(c(1, 2e-3, Some(0.0), 1, 0)), (2e-3, false));
        assert_eq!(judge(c(1, 2e-3, Some(f64::NAN), 1, 0)), (2e-3, false));
        // Two threads: the wall's time; waited when the other ran less than half its share,
        // or the caller's thread less than half the time.
        assert_eq!(judge(c(2, 2e-3, Some(1.9e-3), 8, 4)), (2e-3, false));
        assert_eq!(judge(c(2, 2e-3, Some(1.9e-3), 8, 1)), (2e-3, true));
        assert_eq!(judge(c(2, 2e-3, Some(0.9e-3), 8, 4)), (2e-3, true));
        assert_eq!(judge(c(2, 2e-3, Some(f64::NAN), 8, 4)), (2e-3, true));
        assert_eq!(judge(c(2, 2e-3, None, 8, 4)), (2e-3, false));
        // Two threads asked, one piece: one thread ran it.
        assert_eq!(judge(c(2, 2e-3, Some(1e-3), 1, 0)), (1e-3, false));
    }

    #[test]
    fn measuring_on_a_loaded_machine_by_hand() {
        // A 2-vCPU machine busy with other work, 4 MiB chunks: one thread copies at 0.18 ns a
        // byte (11 GB/s read and written), streaming stores at 0.2; the second thread of a
        // 2-thread candidate waits for a core, so the caller's thread takes its pieces too
        // (0.2 ns a byte) and the chunk is marked as having waited. The 2-thread candidates
        // each get one chunk, the others all their rounds, and one thread is kept.
        let chunk = 4 << 20;
        let rates = [0.18e-9, 0.2e-9, 0.2e-9, 0.21e-9];
        let mut trials = vec![Vec::new(); 4];
        let mut bytes = vec![0; 4];
        let mut order = Vec::new();
        measure(&mut trials, &mut bytes, 4, COST_BUDGET, |c| {
            order.push(c);
            (rates[c], chunk, c >= 2)
        });
        assert_eq!(order, [0, 1, 2, 3, 1, 0, 0, 1, 0, 1]);
        assert_eq!(decide(&trials), 0);
        assert!(cost(&trials, &bytes, Some(0)) < COST_BUDGET);
        // The same where a thread that waits holds the whole chunk up (0.6 GB/s, 7 ms a
        // chunk): measuring stops at once after it, the cost one chunk past the budget at most.
        let rates = [0.18e-9, 0.2e-9, 1.7e-9, 1.7e-9];
        let mut trials = vec![Vec::new(); 4];
        let mut bytes = vec![0; 4];
        let mut order = Vec::new();
        measure(&mut trials, &mut bytes, 4, COST_BUDGET, |c| {
            order.push(c);
            (rates[c], chunk, c >= 2)
        });
        assert_eq!(order, [0, 1, 2]);
        assert_eq!(decide(&trials), 0);
    }

    #[test]
    fn cost_by_hand() {
        // 1000 bytes each at 2, 1 and 3 ns per byte (at best; noise only adds): against the
        // fastest, 1 + 0 + 2 us; against the first, 0 + 0 + 1 us.
        let t = [vec![2e-9, 5e-9], vec![1e-9], vec![3e-9]];
        let n = [1000, 1000, 1000];
        assert!((cost(&t, &n, None) - 3e-6).abs() < 1e-15);
        assert!((cost(&t, &n, Some(0)) - 1e-6).abs() < 1e-15);
        assert_eq!(cost(&[vec![]], &[0], None), 0.0);
    }

    #[test]
    fn decide_by_hand() {
        // One thread 10 ns/byte; streaming 9.5 (far from the fastest); two threads 5.
        assert_eq!(decide(&[vec![10.0], vec![9.5], vec![5.0]]), 2);
        // Within the margin of the fastest but not past it from one thread: not that one.
        assert_eq!(decide(&[vec![10.0], vec![9.5], vec![8.9]]), 2);
        // Within the margin of one thread: one thread stays.
        assert_eq!(decide(&[vec![10.0, 12.0], vec![9.2]]), 0);
        // Cheaper of two near-equals past the margin.
        assert_eq!(decide(&[vec![10.0], vec![5.0], vec![4.9]]), 1);
        // Nothing measured for the first: it stays.
        assert_eq!(decide(&[vec![], vec![1.0]]), 0);
        assert_eq!(decide(&[vec![f64::NAN], vec![1.0]]), 0);
        // A candidate without times can't be picked.
        assert_eq!(decide(&[vec![10.0], vec![], vec![f64::INFINITY]]), 0);
    }

    #[test]
    fn settings_parse() {
        let ok = |t, s| Settings::parse(t, s).unwrap();
        assert_eq!(ok(None, None), Settings::default());
        assert_eq!(ok(Some(" AUTO "), Some("")), Settings::default());
        assert_eq!(
            ok(Some("2"), Some("Streaming")),
            Settings {
                threads: Some(2),
                streaming: Some(true)
            }
        );
        assert_eq!(ok(Some("1"), Some("regular")).streaming, Some(false));
        for bad in ["0", "-1", "two", "257", "1.5"] {
            let e = Settings::parse(Some(bad), None).unwrap_err();
            assert!(e.starts_with(THREADS_VAR) && e.contains(bad), "{e}");
        }
        let e = Settings::parse(None, Some("fast")).unwrap_err();
        assert!(e.starts_with(STORES_VAR) && e.contains("fast"), "{e}");
    }

    #[test]
    fn candidates_by_hand() {
        let c = |class, max| candidates(class, Settings::default(), max);
        let t = |threads, streaming| Choice { threads, streaming };
        let mut two = vec![t(1, false), t(2, false)];
        let mut eight = vec![t(1, false), t(4, false), t(8, false)];
        if cfg!(target_arch = "x86_64") {
            two = vec![t(1, false), t(1, true), t(2, false), t(2, true)];
            eight = vec![
                t(1, false),
                t(1, true),
                t(4, false),
                t(4, true),
                t(8, false),
                t(8, true),
            ];
        }
        assert_eq!(c(Class::Contiguous, 2), two);
        assert_eq!(c(Class::Gather, 2), two);
        assert_eq!(c(Class::Swap, 2), [t(1, false), t(2, false)]);
        assert_eq!(c(Class::Tiles, 8), eight);
        assert_eq!(c(Class::Swap, 1), [t(1, false)]);
        assert_eq!(c(Class::Swap, 3), [t(1, false), t(3, false)]);
    }

    #[test]
    fn lookup_keeps_one_measurement() {
        let tuner = Tuner::new(Limits::DEFAULT, Settings::default(), 2);
        let key = Key {
            class: Class::Swap,
            band: Band::Mid,
            memory: Memory::Mapped,
        };
        let fresh = Key {
            memory: Memory::Fresh,
            ..key
        };
        let Lookup::Measure(cal) = tuner.lookup(key) else {
            panic!("nothing was kept yet");
        };
        // While measuring, others get one thread.
        assert!(matches!(tuner.lookup(key), Lookup::Known(ONE_THREAD)));
        // Dropped unkept: the next copy measures.
        drop(cal);
        let Lookup::Measure(cal) = tuner.lookup(key) else {
            panic!("an abandoned calibration leaves the slot open");
        };
        let two = Choice {
            threads: 2,
            streaming: false,
        };
        let bytes = [2 << 20, 2 << 20];
        assert_eq!(
            cal.keep(&[vec![2e-10], vec![1e-10]], &bytes, 8 << 20, 1e-3),
            two
        );
        assert!(matches!(tuner.lookup(key), Lookup::Known(c) if c == two));
        // Fresh memory is measured apart.
        assert!(tuner.record(fresh).is_none());
        assert!(matches!(tuner.lookup(fresh), Lookup::Measure(_)));
        let Some(Record {
            how: How::Measured(m),
            ..
        }) = tuner.record(key)
        else {
            panic!("a measured record");
        };
        // The first's 2 MiB took 0.21 ms more than the chosen one's rate gives.
        assert!((m.cost_seconds - 1e-10 * (2 << 20) as f64).abs() < 1e-15);
        assert_eq!((m.calibrated_bytes, m.seconds), (4 << 20, 1e-3));
        // Fixed settings leave one candidate: kept without measuring.
        let fixed = Settings {
            threads: Some(3),
            streaming: Some(false),
        };
        let tuner = Tuner::new(Limits::DEFAULT, fixed, 2);
        let three = Choice {
            threads: 3,
            streaming: false,
        };
        let tiles = Key {
            class: Class::Tiles,
            band: Band::Large,
            ..fresh
        };
        assert!(matches!(tuner.lookup(tiles), Lookup::Known(c) if c == three));
        assert_eq!(tuner.record(tiles).unwrap().how, How::Fixed);
    }
}
