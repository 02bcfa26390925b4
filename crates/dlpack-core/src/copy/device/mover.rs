//! What the planner needs from a driver: transfers (linear and pitched), scratch memory, a sync;
//! and when it stages through the host instead of sending many small transfers.

use super::view::{Addr, Place};
use crate::error::Result;

/// The largest pitch drivers accept (CUDA's `CU_DEVICE_ATTRIBUTE_MAX_PITCH` is 2^31 - 1).
pub const MAX_PITCH: usize = i32::MAX as usize;

/// One pitched transfer: `depth` slices of `height` rows of `width` bytes. Rows start `pitch`
/// bytes apart and slices `rows * pitch` bytes apart (`rows >= height`), on each side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pitched {
    pub dst: Addr,
    pub src: Addr,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub dst_pitch: usize,
    pub src_pitch: usize,
    pub dst_rows: usize,
    pub src_rows: usize,
}

/// What the copy planner needs from a driver. Transfers may run asynchronously, in the order
/// they were enqueued; `sync` waits for all of them.
pub trait Mover {
    /// Memory handed out by `scratch`, freed when dropped (after a `sync`).
    type Scratch;
    /// Enqueue a copy of `bytes` contiguous bytes.
    ///
    /// # Safety
    /// The `bytes` bytes at `dst` are writable and those at `src` readable, at their places, and
    /// stay so, untouched by anything else, until the next `sync` returns; the two don't overlap.
    unsafe fn linear(&mut self, dst: Addr, src: Addr, bytes: usize) -> Result<()>;
    /// Enqueue a pitched copy (never between two devices). `Ok(false)`: the driver refused this
    /// layout, and the rows are sent one by one instead.
    ///
    /// # Safety
    /// As for `linear`, for every row of the block on each side.
    unsafe fn pitched(&mut self, block: &Pitched) -> Result<bool>;
    /// `bytes` bytes of memory at `place`.
    fn scratch(&mut self, place: Place, bytes: usize) -> Result<(Addr, Self::Scratch)>;
    /// Wait for every transfer enqueued so far.
    fn sync(&mut self) -> Result<()>;
    /// When to stage through the host.
    fn tuning(&self) -> Tuning {
        TUNING
    }
}

/// When rows go to the driver as they are, and when they are staged through the host instead.
#[derive(Clone, Copy, Debug)]
pub struct Tuning {
    /// Up to this many rows, rows are always sent as they are.
    pub few_rows: usize,
    /// Rows at least this wide are worth a transfer each, up to `many_transfers` transfers.
    pub wide_row: usize,
    pub many_transfers: usize,
}

/// Not yet measured on a GPU: a transfer costs microseconds, a staged byte well under a
/// nanosecond.
pub const TUNING: Tuning = Tuning {
    few_rows: 4096,
    wide_row: 512,
    many_transfers: 64,
};
