//! Copies in which device memory takes part, planned as DMA transfers.
//!
//! A copy is cut into rows that are contiguous on both sides ([`rows`]); rows go to the driver as
//! one linear, 2-D or 3-D pitched memcpy per block, and the loops a pitched copy can't express
//! run from the host. Layouts that would take too many small transfers (a transpose, a gather)
//! are staged through host memory, where the CPU engine reorders them, and sent as whole spans.
//! Copies between two devices go through a dense buffer on each side.
//!
//! The planning and staging here are generic over [`Mover`], the few operations they need from a
//! driver: `cuda` implements it with the CUDA driver, and the tests below with host memory that
//! plays the devices (transfers queued until a sync, pitched copies refused the way a driver
//! may), so every path is checked without a GPU.

use super::cpu::{Strided, byte_span, copy_strided};
use super::plan::{self, Dim, Plan};
use crate::error::{Error, Result};

/// Where memory lives: host memory (pageable or pinned) or a device's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Host,
    Device(i32),
}

/// An address and where it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addr {
    pub at: usize,
    pub place: Place,
}

impl Addr {
    fn offset(self, bytes: isize) -> Addr {
        Addr {
            at: self.at.wrapping_add_signed(bytes),
            place: self.place,
        }
    }
}

/// A strided array of elements: element `i` starts `sum(i_k * strides[k])` bytes from `base`.
#[derive(Clone, Debug)]
pub struct View {
    pub base: Addr,
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
}

impl View {
    /// C-ordered strides for `shape`.
    pub fn c_order(base: Addr, shape: &[usize], itemsize: usize) -> View {
        let mut strides = vec![0isize; shape.len()];
        let mut step = itemsize as isize;
        for (stride, &n) in strides.iter_mut().zip(shape).rev() {
            *stride = step;
            step = step.wrapping_mul(n.max(1) as isize);
        }
        View {
            base,
            shape: shape.to_vec(),
            strides,
        }
    }

    /// The bytes the view touches, relative to `base`: `[low, high)` (empty without elements).
    fn span(&self, itemsize: usize) -> (isize, isize) {
        let base = self.base.at as i128;
        byte_span(&self.as_strided(), itemsize).map_or((0, 0), |(low, high)| {
            ((low - base) as isize, (high - base) as isize)
        })
    }

    fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The same description for the CPU engine's functions (addresses only: nothing is read).
    pub fn as_strided(&self) -> Strided {
        Strided {
            ptr: self.base.at as *mut u8,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
        }
    }
}

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

/// A copy cut into rows contiguous on both sides: `width` bytes each, in blocks of `depth`
/// slices of `height` rows (one pitched transfer per block), the blocks walked by `loops`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rows {
    pub dst_offset: isize,
    pub src_offset: isize,
    pub width: usize,
    pub height: Dim,
    pub depth: Dim,
    pub loops: Vec<Dim>,
}

impl Rows {
    /// Transfers when every block is one pitched copy.
    pub fn transfers(&self) -> usize {
        self.loops.iter().map(|d| d.n).product()
    }

    /// Rows in all.
    pub fn count(&self) -> usize {
        self.transfers()
            .saturating_mul(self.height.n)
            .saturating_mul(self.depth.n)
    }

    /// Whether the whole copy is one contiguous run on both sides.
    fn is_one_run(&self) -> bool {
        self.loops.is_empty() && self.height.n == 1 && self.depth.n == 1
    }
}

const UNIT: Dim = Dim {
    n: 1,
    dst: 0,
    src: 0,
};

/// Cut a planned copy into rows: the innermost loop when it is contiguous on both sides (else
/// single elements), rows from the next loop when both its strides can be pitches, and slices
/// from the one after when its strides are whole numbers of those rows on both sides.
pub fn rows(plan: &Plan, itemsize: usize) -> Rows {
    let mut loops = plan.dims.clone();
    let mut width = itemsize;
    if let Some(inner) = loops.last()
        && inner.dst == itemsize as isize
        && inner.src == itemsize as isize
    {
        width = inner.n * itemsize;
        loops.pop();
    }
    let pitch = |stride: isize| (width..=MAX_PITCH).contains(&(stride.max(0) as usize));
    let (mut height, mut depth) = (UNIT, UNIT);
    if let Some(&h) = loops.last()
        && pitch(h.dst)
        && pitch(h.src)
    {
        height = h;
        loops.pop();
        let stacked = |stride: isize, pitch: isize| {
            stride > 0 && stride % pitch == 0 && (stride / pitch) as usize >= h.n
        };
        if let Some(&d) = loops.last()
            && stacked(d.dst, h.dst)
            && stacked(d.src, h.src)
        {
            depth = d;
            loops.pop();
        }
    }
    Rows {
        dst_offset: plan.dst_offset,
        src_offset: plan.src_offset,
        width,
        height,
        depth,
        loops,
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

/// Copy `src` into `dst`: views of the same shape and byte order, of `itemsize`-byte elements,
/// sharing no bytes. Transfers into device memory may still be pending when this returns (the
/// caller syncs when it must); host memory it wrote is complete.
///
/// # Safety
/// Every byte of every element of `dst` is writable, and every byte `src` spans (gaps between
/// its elements included) readable, at their places, and stays so, untouched by anything else,
/// until the mover's next `sync` after this returns (or until this returns, for host memory
/// this writes); the two share no bytes.
pub unsafe fn copy_views<M: Mover>(
    m: &mut M,
    dst: &View,
    src: &View,
    itemsize: usize,
) -> Result<()> {
    let Some(plan) = plan::plan(&dst.shape, &dst.strides, &src.strides) else {
        return Ok(());
    };
    let rows = rows(&plan, itemsize);
    match (dst.base.place, src.base.place) {
        (Place::Host, Place::Host) => {
            m.sync()?;
            // SAFETY: per the contract; nothing is pending after the sync.
            unsafe { cpu(dst, src, itemsize) }
        }
        (Place::Device(a), Place::Device(b)) if a != b => {
            // SAFETY: per the contract.
            unsafe { between_devices(m, dst, src, itemsize, &rows) }
        }
        _ if rows.count() <= m.tuning().few_rows
            || (rows.width >= m.tuning().wide_row
                && rows.transfers() <= m.tuning().many_transfers) =>
        {
            // SAFETY: the rows address exactly the views' elements, as the contract needs.
            unsafe { transfer(m, dst.base, src.base, &rows) }
        }
        // SAFETY: per the contract.
        _ => unsafe { staged(m, dst, src, itemsize, &rows) },
    }
}

/// The CPU engine on two host views.
///
/// # Safety
/// As for `copy_views`, and no transfer into or out of the views is pending.
unsafe fn cpu(dst: &View, src: &View, itemsize: usize) -> Result<()> {
    if dst.base.place != Place::Host || src.base.place != Place::Host {
        return Err(Error::Runtime(
            "internal error: the CPU engine was handed device memory".into(),
        ));
    }
    let (to, from) = (dst.as_strided(), src.as_strided());
    // SAFETY: per the contract, both views lie in live host memory, share no bytes, and no
    // transfer into or out of them is pending.
    unsafe { copy_strided(&to, &from, itemsize, None) };
    Ok(())
}

/// Send the rows: one transfer per block, rows one by one where the driver refuses a block.
///
/// # Safety
/// The rows from `dst` and `src` address memory as `copy_views` requires.
unsafe fn transfer<M: Mover>(m: &mut M, dst: Addr, src: Addr, rows: &Rows) -> Result<()> {
    let mut index = vec![0usize; rows.loops.len()];
    loop {
        let (mut d, mut s) = (rows.dst_offset, rows.src_offset);
        for (&i, l) in index.iter().zip(&rows.loops) {
            d += i as isize * l.dst;
            s += i as isize * l.src;
        }
        // SAFETY: per the contract, for this block of the rows.
        unsafe { block(m, dst.offset(d), src.offset(s), rows)? };
        // The next block, innermost loop fastest.
        let mut k = index.len();
        loop {
            if k == 0 {
                return Ok(());
            }
            k -= 1;
            index[k] += 1;
            if index[k] < rows.loops[k].n {
                break;
            }
            index[k] = 0;
        }
    }
}

/// One block of rows: one pitched transfer, or its rows one by one.
///
/// # Safety
/// As for `transfer`, for this block.
unsafe fn block<M: Mover>(m: &mut M, dst: Addr, src: Addr, rows: &Rows) -> Result<()> {
    let (h, d) = (rows.height, rows.depth);
    if h.n == 1 && d.n == 1 {
        // SAFETY: per the contract: the block is one row.
        return unsafe { m.linear(dst, src, rows.width) };
    }
    let slices = |stride: isize, pitch: isize| {
        if d.n > 1 {
            (stride / pitch) as usize
        } else {
            h.n
        }
    };
    let pitched = Pitched {
        dst,
        src,
        width: rows.width,
        height: h.n,
        depth: d.n,
        dst_pitch: h.dst as usize,
        src_pitch: h.src as usize,
        dst_rows: slices(d.dst, h.dst),
        src_rows: slices(d.src, h.src),
    };
    // SAFETY: per the contract: the block's rows.
    if unsafe { m.pitched(&pitched)? } {
        return Ok(());
    }
    for z in 0..d.n as isize {
        for y in 0..h.n as isize {
            let (to, from) = (
                dst.offset(z * d.dst + y * h.dst),
                src.offset(z * d.src + y * h.src),
            );
            // SAFETY: per the contract: one row of the block.
            unsafe { m.linear(to, from, rows.width)? };
        }
    }
    Ok(())
}

/// Bring the bytes `view` spans into host memory: the returned view addresses the copy (valid
/// after a sync), kept alive by the scratch.
///
/// # Safety
/// Every byte `view` spans (gaps between its elements included) is readable until the next
/// `sync`.
unsafe fn to_host_span<M: Mover>(
    m: &mut M,
    view: &View,
    itemsize: usize,
) -> Result<(View, M::Scratch)> {
    let (low, high) = view.span(itemsize);
    let (at, keep) = m.scratch(Place::Host, (high - low) as usize)?;
    // SAFETY: per the contract for the source; the scratch is ours, and the caller keeps it
    // until after the next sync.
    unsafe { m.linear(at, view.base.offset(low), (high - low) as usize)? };
    let staged = View {
        base: at.offset(-low),
        shape: view.shape.clone(),
        strides: view.strides.clone(),
    };
    Ok((staged, keep))
}

/// Layouts that would take many small transfers: reorder on the host, move whole spans.
///
/// # Safety
/// As for `copy_views`, and every byte `src` spans is readable (a source is read whole).
unsafe fn staged<M: Mover>(
    m: &mut M,
    dst: &View,
    src: &View,
    itemsize: usize,
    rows: &Rows,
) -> Result<()> {
    let (low, high) = dst.span(itemsize);
    let gapless = (high - low) as usize == dst.numel() * itemsize;
    match (dst.base.place, src.base.place) {
        (Place::Host, _) => {
            // SAFETY: per the contract, `src`'s span is readable.
            let (from, _keep) = unsafe { to_host_span(m, src, itemsize)? };
            m.sync()?;
            // SAFETY: `dst` per the contract, `from` our scratch, complete after the sync.
            unsafe { cpu(dst, &from, itemsize) }
        }
        // The destination's bytes are all its own, so its whole span can be written at once
        // from an image built on the host.
        _ if gapless => {
            let (image, _keep_image) = m.scratch(Place::Host, (high - low) as usize)?;
            let target = View {
                base: image.offset(-low),
                shape: dst.shape.clone(),
                strides: dst.strides.clone(),
            };
            if src.base.place == Place::Host {
                // SAFETY: `target` lies in our scratch, `src` is host memory per the contract.
                unsafe { cpu(&target, src, itemsize)? };
            } else {
                // SAFETY: per the contract, `src`'s span is readable.
                let (from, _keep) = unsafe { to_host_span(m, src, itemsize)? };
                m.sync()?;
                // SAFETY: both in our scratch, `from` complete after the sync.
                unsafe { cpu(&target, &from, itemsize)? };
            }
            // SAFETY: the destination's span is its elements' bytes alone (gapless), writable
            // per the contract; the image is our scratch, kept until after the sync.
            unsafe { m.linear(dst.base.offset(low), image, (high - low) as usize)? };
            m.sync()
        }
        // Writing the span of a destination with gaps would overwrite bytes that aren't ours:
        // without a kernel, rows one by one are the exact way.
        // SAFETY: the rows address exactly the views' elements.
        _ => unsafe { transfer(m, dst.base, src.base, rows) },
    }
}

/// Between two devices: the source made dense on its device, one peer transfer, and the
/// destination filled from a dense buffer on its own device.
///
/// # Safety
/// As for `copy_views`.
unsafe fn between_devices<M: Mover>(
    m: &mut M,
    dst: &View,
    src: &View,
    itemsize: usize,
    rows: &Rows,
) -> Result<()> {
    if rows.is_one_run() {
        let (d, s) = (
            dst.base.offset(rows.dst_offset),
            src.base.offset(rows.src_offset),
        );
        // SAFETY: per the contract: the views are one run each.
        return unsafe { m.linear(d, s, rows.width) };
    }
    let bytes = dst.numel() * itemsize;
    let (near, _keep_near) = m.scratch(src.base.place, bytes)?;
    let near = View::c_order(near, &dst.shape, itemsize);
    // SAFETY: `src` per the contract, `near` our scratch, kept until after the syncs.
    unsafe { copy_views(m, &near, src, itemsize)? };
    // Work on different devices is ordered by the host.
    m.sync()?;
    let (far, _keep_far) = m.scratch(dst.base.place, bytes)?;
    // SAFETY: both our scratch, `near` complete after the sync.
    unsafe { m.linear(far, near.base, bytes)? };
    let far = View::c_order(far, &dst.shape, itemsize);
    // SAFETY: `dst` per the contract, `far` our scratch, kept until after the sync.
    unsafe { copy_views(m, dst, &far, itemsize)? };
    m.sync()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::AlignedBuffer;
    use proptest::prelude::*;
    use std::cell::Cell;
    use std::rc::Rc;

    fn dim(n: usize, dst: isize, src: isize) -> Dim {
        Dim { n, dst, src }
    }

    fn rows_of(shape: &[usize], dst: &[isize], src: &[isize], itemsize: usize) -> Rows {
        rows(&plan::plan(shape, dst, src).unwrap(), itemsize)
    }

    #[test]
    fn contiguous_is_one_run() {
        let r = rows_of(&[4, 5], &[20, 4], &[20, 4], 4);
        assert_eq!(r.width, 80);
        assert!(r.is_one_run());
    }

    #[test]
    fn column_slice_is_one_2d_transfer() {
        // dst: dense (6, 3) float32; src: x[:, :3] of a (6, 10) array.
        let r = rows_of(&[6, 3], &[12, 4], &[40, 4], 4);
        assert_eq!((r.width, r.height, r.depth), (12, dim(6, 12, 40), UNIT));
        assert_eq!(r.transfers(), 1);
    }

    #[test]
    fn sliced_3d_is_one_3d_transfer() {
        // src: x[:, :5, :3] of a (4, 8, 10) array; slices are 8 rows of 40 bytes apart.
        let r = rows_of(&[4, 5, 3], &[60, 12, 4], &[320, 40, 4], 4);
        assert_eq!(
            (r.width, r.height, r.depth),
            (12, dim(5, 12, 40), dim(4, 60, 320))
        );
        assert!(r.loops.is_empty());
    }

    #[test]
    fn transpose_is_element_rows() {
        let r = rows_of(&[3, 4], &[16, 4], &[4, 12], 4);
        assert_eq!((r.width, r.height), (4, dim(4, 4, 12)));
        assert_eq!(r.loops, vec![dim(3, 16, 4)]);
        assert_eq!(r.count(), 12);
    }

    #[test]
    fn broadcast_source_loops() {
        // A (1, 8) row broadcast into (5, 8): the stride-0 loop can't be a pitch.
        let r = rows_of(&[5, 8], &[32, 4], &[0, 4], 4);
        assert_eq!((r.width, r.height), (32, UNIT));
        assert_eq!(r.loops, vec![dim(5, 32, 0)]);
    }

    /// Host memory playing devices. Transfers queue until `sync`, one queue per device (a
    /// stream each), and the queues run last device first, so work on two devices that the
    /// engine didn't order shows up as wrong bytes. The CPU engine runs at once. Pitched copies
    /// check the driver's rules and may be refused between one device's buffers, as
    /// `cuMemcpy2D` may refuse pitches it didn't allocate. Scratch stays allocated until the
    /// emulator goes, so a transfer that outlives its scratch fails an assertion, not memory.
    struct Emulator {
        queues: std::collections::BTreeMap<i32, Vec<(Addr, Addr, usize)>>,
        scratch: Vec<(AlignedBuffer, usize, Rc<Cell<bool>>)>,
        /// The test's own buffers, `(start, len)`.
        buffers: Vec<(usize, usize)>,
        refuse_pitched: bool,
        tuning: Tuning,
        pitched_calls: usize,
        linear_calls: usize,
    }

    /// Scratch handed out by the emulator: dropping it marks the memory freed.
    struct Freed(Rc<Cell<bool>>);

    impl Drop for Freed {
        fn drop(&mut self) {
            self.0.set(false);
        }
    }

    impl Emulator {
        /// The device whose stream runs a transfer: the destination's, else the source's.
        fn enqueue(&mut self, dst: Addr, src: Addr, bytes: usize) {
            let device = match (dst.place, src.place) {
                (Place::Device(d), _) | (Place::Host, Place::Device(d)) => d,
                (Place::Host, Place::Host) => panic!("a host-to-host transfer"),
            };
            self.queues
                .entry(device)
                .or_default()
                .push((dst, src, bytes));
        }

        /// The range lies in the test's buffers or in live scratch.
        fn check(&self, at: usize, bytes: usize) {
            let inside = |start: usize, len: usize| start <= at && at + bytes <= start + len;
            for (buffer, len, alive) in &self.scratch {
                if inside(buffer.as_ptr() as usize, *len) {
                    assert!(alive.get(), "a transfer touches scratch that was freed");
                    return;
                }
            }
            assert!(
                self.buffers.iter().any(|&(start, len)| inside(start, len)),
                "a transfer outside every buffer"
            );
        }
    }

    impl Mover for Emulator {
        type Scratch = Freed;

        unsafe fn linear(&mut self, dst: Addr, src: Addr, bytes: usize) -> Result<()> {
            self.linear_calls += 1;
            self.enqueue(dst, src, bytes);
            Ok(())
        }

        unsafe fn pitched(&mut self, b: &Pitched) -> Result<bool> {
            assert!(
                !matches!((b.dst.place, b.src.place), (Place::Device(x), Place::Device(y)) if x != y),
                "a pitched transfer between two devices"
            );
            assert!(b.width <= b.dst_pitch && b.width <= b.src_pitch);
            assert!(b.dst_pitch <= MAX_PITCH && b.src_pitch <= MAX_PITCH);
            assert!(b.dst_rows >= b.height && b.src_rows >= b.height);
            if self.refuse_pitched && b.dst.place != Place::Host && b.src.place != Place::Host {
                return Ok(false);
            }
            self.pitched_calls += 1;
            for z in 0..b.depth {
                for y in 0..b.height {
                    let d = b.dst.at + (z * b.dst_rows + y) * b.dst_pitch;
                    let s = b.src.at + (z * b.src_rows + y) * b.src_pitch;
                    self.enqueue(Addr { at: d, ..b.dst }, Addr { at: s, ..b.src }, b.width);
                }
            }
            Ok(true)
        }

        fn scratch(&mut self, place: Place, bytes: usize) -> Result<(Addr, Freed)> {
            let buffer = AlignedBuffer::new(bytes)?;
            let at = buffer.as_ptr() as usize;
            // Poison it, so reading what wasn't written shows.
            // SAFETY: the buffer holds `bytes` bytes.
            unsafe { std::ptr::write_bytes(buffer.as_ptr(), 0xEE, bytes) };
            let alive = Rc::new(Cell::new(true));
            self.scratch.push((buffer, bytes, Rc::clone(&alive)));
            Ok((Addr { at, place }, Freed(alive)))
        }

        fn sync(&mut self) -> Result<()> {
            let queues = std::mem::take(&mut self.queues);
            for (_, queue) in queues.into_iter().rev() {
                for (dst, src, bytes) in queue {
                    self.check(dst.at, bytes);
                    self.check(src.at, bytes);
                    // SAFETY: the ranges were checked just above to lie inside the test's
                    // buffers or live scratch.
                    unsafe { std::ptr::copy(src.at as *const u8, dst.at as *mut u8, bytes) };
                }
            }
            Ok(())
        }

        fn tuning(&self) -> Tuning {
            self.tuning
        }
    }

    fn emulator(refuse_pitched: bool, tuning: Tuning, sides: [&Side; 2]) -> Emulator {
        Emulator {
            queues: Default::default(),
            scratch: Vec::new(),
            buffers: sides
                .iter()
                .map(|side| (side.bytes.as_ptr() as usize, side.bytes.len()))
                .collect(),
            refuse_pitched,
            tuning,
            pitched_calls: 0,
            linear_calls: 0,
        }
    }

    /// A buffer of `len` bytes with a view into it at `offset`.
    struct Side {
        bytes: Vec<u8>,
        offset: usize,
        shape: Vec<usize>,
        strides: Vec<isize>,
        place: Place,
    }

    impl Side {
        fn view(&mut self) -> View {
            View {
                base: Addr {
                    at: self.bytes.as_mut_ptr() as usize + self.offset,
                    place: self.place,
                },
                shape: self.shape.clone(),
                strides: self.strides.clone(),
            }
        }

        fn element(&self, index: &[usize], itemsize: usize) -> &[u8] {
            let at = index
                .iter()
                .zip(&self.strides)
                .fold(self.offset as isize, |acc, (&i, &s)| acc + i as isize * s);
            &self.bytes[at as usize..at as usize + itemsize]
        }
    }

    /// Strides (in items, possibly negative or zero) for `shape`, and the buffer that holds them.
    fn side(shape: &[usize], steps: &[isize], itemsize: usize, place: Place, fill: u8) -> Side {
        let strides: Vec<isize> = steps.iter().map(|&s| s * itemsize as isize).collect();
        let view = View {
            base: Addr { at: 0, place },
            shape: shape.to_vec(),
            strides: strides.clone(),
        };
        let (low, high) = view.span(itemsize);
        let len = (high - low) as usize + 16;
        let bytes: Vec<u8> = (0..len)
            .map(|i| fill.wrapping_add((i * 7 % 251) as u8))
            .collect();
        Side {
            bytes,
            offset: (-low) as usize + 3,
            shape: shape.to_vec(),
            strides,
            place,
        }
    }

    /// The real tuning, or thresholds so low that small cases take the staged paths too.
    fn tuning_strategy() -> impl Strategy<Value = Tuning> {
        prop_oneof![
            Just(TUNING),
            (0usize..8, 1usize..64, 0usize..4).prop_map(|(few_rows, wide_row, many_transfers)| {
                Tuning {
                    few_rows,
                    wide_row,
                    many_transfers,
                }
            }),
        ]
    }

    fn place_strategy() -> impl Strategy<Value = Place> {
        prop_oneof![
            Just(Place::Host),
            Just(Place::Device(0)),
            Just(Place::Device(1))
        ]
    }

    /// Destination steps: a permutation of C order, optionally with gaps and reversed loops
    /// (never overlapping, as a writable array's aren't).
    fn dst_steps(shape: &[usize], order: &[usize], gaps: &[usize], flips: &[bool]) -> Vec<isize> {
        let mut steps = vec![0isize; shape.len()];
        let mut step = 1isize;
        for &k in order.iter().rev() {
            steps[k] = step * gaps[k] as isize;
            step = steps[k] * shape[k] as isize;
        }
        for (s, &f) in steps.iter_mut().zip(flips) {
            if f {
                *s = -*s;
            }
        }
        steps
    }

    /// Shape, destination loop order, gaps and flips, source steps, item size, places, whether
    /// the driver refuses pitched copies between one device's buffers, and the staging tuning.
    type Case = (
        Vec<usize>,
        Vec<usize>,
        Vec<usize>,
        Vec<bool>,
        Vec<isize>,
        usize,
        (Place, Place),
        (bool, Tuning),
    );

    fn copy_case(case: Case) {
        let (shape, order, gaps, flips, src_steps, itemsize, places, (refuse_pitched, tuning)) =
            case;
        let steps = dst_steps(&shape, &order, &gaps, &flips);
        let mut dst = side(&shape, &steps, itemsize, places.0, 0);
        let mut src = side(&shape, &src_steps, itemsize, places.1, 100);
        let before = dst.bytes.clone();
        let mut m = emulator(refuse_pitched, tuning, [&dst, &src]);
        // SAFETY: both views lie in their sides' buffers, which outlive the sync.
        unsafe { copy_views(&mut m, &dst.view(), &src.view(), itemsize).unwrap() };
        m.sync().unwrap();
        // Every element arrived, and no byte outside the destination's elements changed.
        let mut touched = vec![false; dst.bytes.len()];
        let numel: usize = shape.iter().product();
        for flat in 0..numel {
            let mut index = vec![0usize; shape.len()];
            let mut rest = flat;
            for k in (0..shape.len()).rev() {
                index[k] = rest % shape[k];
                rest /= shape[k];
            }
            assert_eq!(
                dst.element(&index, itemsize),
                src.element(&index, itemsize),
                "element {index:?}"
            );
            let at = index
                .iter()
                .zip(&dst.strides)
                .fold(dst.offset as isize, |acc, (&i, &s)| acc + i as isize * s)
                as usize;
            touched[at..at + itemsize]
                .iter_mut()
                .for_each(|t| *t = true);
        }
        for (i, t) in touched.iter().enumerate() {
            if !t {
                assert_eq!(dst.bytes[i], before[i], "byte {i} outside the destination");
            }
        }
    }

    fn case_strategy() -> impl Strategy<Value = Case> {
        (1usize..=4)
            .prop_flat_map(|ndim| {
                (
                    prop::collection::vec(0usize..=6, ndim),
                    Just((0..ndim).collect::<Vec<_>>()).prop_shuffle(),
                    prop::collection::vec(prop_oneof![3 => Just(1usize), 1 => 2usize..=3], ndim),
                    prop::collection::vec(any::<bool>(), ndim),
                    prop::collection::vec(-40isize..=40, ndim),
                    prop_oneof![Just(1usize), Just(2), Just(4), Just(8), Just(16)],
                    (place_strategy(), place_strategy()),
                    (any::<bool>(), tuning_strategy()),
                )
            })
            .prop_filter("at least one side is a device", |c| {
                c.6 != (Place::Host, Place::Host)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1500))]

        #[test]
        fn copies_match_the_reference(case in case_strategy()) {
            copy_case(case);
        }

        /// Sources that are permutations of dense memory, as arrays usually are.
        #[test]
        fn dense_sources_match_the_reference(
            (shape, order, gaps, flips, _src, itemsize, places, driver) in case_strategy(),
            src_order in Just((0..4).collect::<Vec<usize>>()).prop_shuffle(),
        ) {
            let src_order: Vec<usize> = src_order.into_iter().filter(|&k| k < shape.len()).collect();
            let src_steps = dst_steps(&shape, &src_order, &vec![1; shape.len()], &flips);
            copy_case((shape, order, gaps, flips, src_steps, itemsize, places, driver));
        }
    }

    #[test]
    fn large_transpose_to_a_device_is_staged() {
        // 100 x 100 float32 transpose: 10,000 element rows, above FEW_ROWS: the destination is
        // gapless, so one host image and one transfer.
        let n = 100usize;
        let mut dst = side(&[n, n], &[n as isize, 1], 4, Place::Device(0), 0);
        let mut src = side(&[n, n], &[1, n as isize], 4, Place::Host, 9);
        let mut m = emulator(false, TUNING, [&dst, &src]);
        // SAFETY: as in `copy_case`.
        unsafe { copy_views(&mut m, &dst.view(), &src.view(), 4).unwrap() };
        m.sync().unwrap();
        assert_eq!((m.linear_calls, m.pitched_calls), (1, 0));
        assert_eq!(dst.element(&[3, 7], 4), src.element(&[3, 7], 4));
    }

    #[test]
    fn sliced_device_to_host_is_one_pitched_transfer() {
        let mut dst = side(&[64, 32], &[32, 1], 4, Place::Host, 0);
        let mut src = side(&[64, 32], &[100, 1], 4, Place::Device(0), 9);
        let mut m = emulator(false, TUNING, [&dst, &src]);
        // SAFETY: as in `copy_case`.
        unsafe { copy_views(&mut m, &dst.view(), &src.view(), 4).unwrap() };
        m.sync().unwrap();
        assert_eq!((m.linear_calls, m.pitched_calls), (0, 1));
        assert_eq!(dst.element(&[63, 31], 4), src.element(&[63, 31], 4));
    }
}
